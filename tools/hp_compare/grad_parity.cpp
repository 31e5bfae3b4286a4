#include "tools/hp_compare/grad_parity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <stdexcept>
#include <vector>

#include "checkpoint/safetensors_format.h"

namespace fs = std::filesystem;

namespace hp::compare {

namespace {

using Dims = std::vector<std::int64_t>;

/// One rank's slice of one gradient, with where it belongs.
struct Slice {
  int rank = 0;
  std::string file;
  Dims global_shape, offsets, shape;
  bool placed = false;        ///< the file said where (else: a whole tensor)
  std::vector<int> replicas;  ///< ranks holding the identical slice (placed only)
  std::string dtype;          ///< its safetensors dtype ("F32")
  std::string bytes;          ///< as written (replicas compare bitwise)
  std::vector<double> values; ///< the bytes as numbers, row-major
};

std::string dims(const Dims& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

std::string ranks_of(const std::vector<int>& r) {
  std::string s = "[";
  for (std::size_t i = 0; i < r.size(); ++i) s += (i ? ", " : "") + std::to_string(r[i]);
  return s + "]";
}

std::int64_t volume(const Dims& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

/// An IEEE half's value.
double from_half(std::uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(mant, -24);
  } else if (exp == 31) {
    v = mant ? std::nan("") : INFINITY;
  } else {
    v = std::ldexp(mant + 1024, exp - 25);
  }
  return sign ? -v : v;
}

/// The numbers `bytes` of safetensors dtype `dtype` hold (little-endian).
std::vector<double> to_doubles(const std::string& bytes, const std::string& dtype) {
  const std::size_t size = hp::ckpt::safetensors_element_size(dtype);
  const std::size_t n = size ? bytes.size() / size : 0;
  std::vector<double> out(n);
  const char* p = bytes.data();
  auto load = [&](auto zero, std::size_t i) {
    decltype(zero) v;
    std::memcpy(&v, p + i * sizeof v, sizeof v);
    return v;
  };
  for (std::size_t i = 0; i < n; ++i) {
    if (dtype == "F64") {
      out[i] = load(double{}, i);
    } else if (dtype == "F32") {
      out[i] = load(float{}, i);
    } else if (dtype == "BF16") {
      const std::uint32_t w = static_cast<std::uint32_t>(load(std::uint16_t{}, i)) << 16;
      float f;
      std::memcpy(&f, &w, sizeof f);
      out[i] = f;
    } else if (dtype == "F16") {
      out[i] = from_half(load(std::uint16_t{}, i));
    } else if (dtype == "I64") {
      out[i] = static_cast<double>(load(std::int64_t{}, i));
    } else if (dtype == "I32") {
      out[i] = load(std::int32_t{}, i);
    } else if (dtype == "I16") {
      out[i] = load(std::int16_t{}, i);
    } else if (dtype == "I8") {
      out[i] = load(std::int8_t{}, i);
    } else {  // U8, BOOL
      out[i] = load(std::uint8_t{}, i);
    }
  }
  return out;
}

/// Copies a row-major box of `shape` into `full` (row-major `global`) at `offsets`.
void place(const std::vector<double>& box, const Dims& shape, const Dims& offsets, const Dims& global,
           std::vector<double>& full) {
  const std::size_t rank = global.size();
  if (volume(shape) == 0) return;
  if (rank == 0) {
    full[0] = box[0];
    return;
  }
  // Rows of the last dimension, walked with an index over the others.
  const std::int64_t row = shape[rank - 1];
  Dims at(rank, 0);
  for (std::int64_t src = 0; src < volume(shape); src += row) {
    std::int64_t dst = 0;
    for (std::size_t k = 0; k < rank; ++k) dst = dst * global[k] + offsets[k] + at[k];
    std::copy(box.begin() + src, box.begin() + src + row, full.begin() + dst);
    for (std::size_t k = rank - 1; k-- > 0;) {
      if (++at[k] < shape[k]) break;
      at[k] = 0;
    }
  }
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

/// A side (reference or run): every slice of every gradient.
struct Dump {
  std::string side, dir;
  std::map<std::string, std::vector<Slice>> slices;
  std::size_t files = 0;
};

Dump read_dump(const std::string& side, const std::string& dir) {
  Dump d{side, dir, {}, 0};
  if (!fs::is_directory(dir)) throw std::runtime_error("no gradient dump at " + dir);
  std::vector<fs::path> paths;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") paths.push_back(e.path());
  }
  std::sort(paths.begin(), paths.end());
  static const std::regex kRank("grads-rank([0-9]+)\\.safetensors");
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const std::string path = paths[i].string(), file = paths[i].filename().string();
    ckpt::SafetensorsFile r(path);
    ++d.files;
    int rank = static_cast<int>(i);
    std::smatch m;
    if (r.metadata().count("rank")) {
      rank = std::stoi(r.metadata().at("rank"));
    } else if (std::regex_match(file, m, kRank)) {
      rank = std::stoi(m[1].str());
    }
    nlohmann::json placement = nlohmann::json::object();
    if (r.metadata().count("placement")) {
      try {
        placement = nlohmann::json::parse(r.metadata().at("placement"));
      } catch (const std::exception& e) {
        throw std::runtime_error(path + ": __metadata__.placement is not JSON: " + e.what());
      }
    }
    for (const auto& name : r.names()) {
      Slice s;
      s.rank = rank;
      s.file = file;
      const auto& entry = r.entry(name);
      s.dtype = entry.dtype;
      s.bytes = r.bytes(name);
      s.values = to_doubles(s.bytes, s.dtype);
      s.shape = entry.shape;
      if (placement.contains(name)) {
        try {
          const auto& p = placement.at(name);
          s.global_shape = p.at("global_shape").get<Dims>();
          s.offsets = p.at("offsets").get<Dims>();
          s.replicas = p.at("replicas").get<std::vector<int>>();
          if (p.at("shape").get<Dims>() != s.shape) {
            throw std::runtime_error("placement shape " + dims(p.at("shape").get<Dims>()) +
                                     " but the tensor is " + dims(s.shape));
          }
          if (s.global_shape.size() != s.shape.size() || s.offsets.size() != s.shape.size()) {
            throw std::runtime_error("global_shape, offsets and shape differ in rank");
          }
        } catch (const std::exception& e) {
          throw std::runtime_error(path + ": bad placement of " + name + ": " + e.what());
        }
        std::sort(s.replicas.begin(), s.replicas.end());
        s.placed = true;
      } else {
        s.global_shape = s.shape;
        s.offsets.assign(s.shape.size(), 0);
      }
      d.slices[name].push_back(std::move(s));
    }
  }
  return d;
}

/// Two slices of the same dtype and shape hold the same bytes.
bool bitwise_equal(const Slice& a, const Slice& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.bytes == b.bytes;
}

/// Assembles every gradient of `d` from its slices, checking the dump.
/// Failures are printed ("FAIL: ...") and counted in `failures`.
struct Full {
  Dims shape;
  std::vector<double> values;
};
struct Assembled {
  std::map<std::string, Full> full;
  std::int64_t copies_checked = 0;  ///< replica copies found bitwise equal to the first
  std::string copy_example;         ///< one gradient whose copies were checked
  std::int64_t slices = 0;
};

Assembled assemble(const Dump& d, std::int64_t step, int& failures) {
  Assembled out;
  const std::string where = "in the " + d.side + " (" + d.dir + ")";
  auto fail = [&](const std::string& msg) {
    std::printf("FAIL: %s\n", msg.c_str());
    ++failures;
  };
  for (const auto& [name, slices] : d.slices) {
    out.slices += static_cast<std::int64_t>(slices.size());
    const std::string what = "gradient " + name + " of step " + std::to_string(step);
    bool ok = true;
    for (const auto& s : slices) {
      const bool nan = std::any_of(s.values.begin(), s.values.end(), [](double v) { return std::isnan(v); });
      const bool inf = std::any_of(s.values.begin(), s.values.end(), [](double v) { return std::isinf(v); });
      if (nan || inf) {
        fail(what + " holds " + (nan ? "NaN" : "an infinity") + " " + where + ", rank " +
             std::to_string(s.rank) + " (" + s.file + ")");
        ok = false;
      }
    }
    const Slice& first = slices.front();
    for (const auto& s : slices) {
      if (s.global_shape != first.global_shape || s.dtype != first.dtype) {
        fail(what + " " + where + ": rank " + std::to_string(first.rank) + " gives global shape " +
             dims(first.global_shape) + " " + first.dtype + ", rank " + std::to_string(s.rank) + " " +
             dims(s.global_shape) + " " + s.dtype);
        ok = false;
        break;
      }
    }
    if (!ok) continue;
    // Copies of one box are replicas: bitwise equal, and held by exactly the
    // ranks their replicate group names.
    std::map<std::pair<Dims, Dims>, std::vector<const Slice*>> boxes;
    for (const auto& s : slices) boxes[{s.offsets, s.shape}].push_back(&s);
    for (const auto& [box, copies] : boxes) {
      const std::string slice =
          what + " slice at " + dims(box.first) + " of shape " + dims(box.second);
      const Slice& a = *copies.front();
      for (std::size_t i = 1; i < copies.size(); ++i) {
        const Slice& b = *copies[i];
        if (bitwise_equal(a, b)) {
          ++out.copies_checked;
          if (out.copy_example.empty()) {
            out.copy_example =
                name + " on ranks " + std::to_string(a.rank) + " and " + std::to_string(b.rank);
          }
          continue;
        }
        const double diff = max_abs_diff(a.values, b.values);
        char buf[64];
        std::snprintf(buf, sizeof buf, " (max |a-b| %.3e)", diff);
        fail(slice + ": the replicas on rank " + std::to_string(a.rank) + " and rank " +
             std::to_string(b.rank) + " differ " + where + buf);
        ok = false;
      }
      std::vector<int> holders;
      std::vector<int> named;
      bool placed = false;
      for (const Slice* c : copies) {
        holders.push_back(c->rank);
        if (c->placed) {
          placed = true;
          named.insert(named.end(), c->replicas.begin(), c->replicas.end());
        }
      }
      std::sort(holders.begin(), holders.end());
      std::sort(named.begin(), named.end());
      named.erase(std::unique(named.begin(), named.end()), named.end());
      if (placed && holders != named) {
        fail(slice + " " + where + ": written by ranks " + ranks_of(holders) +
             " but its replicate group is " + ranks_of(named) +
             " (a rank's file is missing, or the placement is wrong)");
        ok = false;
      }
    }
    // The distinct boxes tile the global shape: inside it, pairwise
    // disjoint, and as many elements as it has.
    std::vector<std::pair<Dims, Dims>> distinct;
    std::vector<int> owner;
    for (const auto& [box, copies] : boxes) {
      distinct.push_back(box);
      owner.push_back(copies.front()->rank);
    }
    const Dims& g = first.global_shape;
    std::int64_t covered = 0;
    for (std::size_t i = 0; i < distinct.size(); ++i) {
      const auto& [off, shp] = distinct[i];
      for (std::size_t k = 0; k < g.size(); ++k) {
        if (off[k] < 0 || off[k] + shp[k] > g[k]) {
          fail(what + " " + where + ": the slice of rank " + std::to_string(owner[i]) + " at " +
               dims(off) + " of shape " + dims(shp) + " lies outside the global shape " + dims(g));
          ok = false;
          break;
        }
      }
      covered += volume(shp);
      for (std::size_t j = 0; j < i; ++j) {
        const auto& [off2, shp2] = distinct[j];
        bool meet = volume(shp) > 0 && volume(shp2) > 0;
        for (std::size_t k = 0; k < g.size() && meet; ++k) {
          meet = std::max(off[k], off2[k]) < std::min(off[k] + shp[k], off2[k] + shp2[k]);
        }
        if (meet) {
          fail(what + " " + where + ": the slices of rank " + std::to_string(owner[j]) + " (at " +
               dims(off2) + ", shape " + dims(shp2) + ") and rank " + std::to_string(owner[i]) +
               " (at " + dims(off) + ", shape " + dims(shp) +
               ") overlap without being the same slice");
          ok = false;
        }
      }
    }
    if (ok && covered != volume(g)) {
      fail(what + " " + where + ": its slices cover " + std::to_string(covered) + " of the " +
           std::to_string(volume(g)) + " elements of its global shape " + dims(g) +
           " (a gap: a rank's slice is missing)");
      ok = false;
    }
    if (!ok) continue;
    Full full{g, std::vector<double>(static_cast<std::size_t>(volume(g)))};
    for (const auto& [box, copies] : boxes) place(copies.front()->values, box.second, box.first, g, full.values);
    out.full[name] = std::move(full);
  }
  return out;
}

}  // namespace

int compare_grads(const std::string& ref_dir, const std::string& run_dir, const GradOptions& o) {
  const std::string sub = "/grads_step" + std::to_string(o.step);
  const Dump da = read_dump("reference", ref_dir + sub), db = read_dump("run", run_dir + sub);
  int failures = 0;
  const Assembled a = assemble(da, o.step, failures), b = assemble(db, o.step, failures);
  for (const auto& [d, s] : {std::pair{&da, &a}, std::pair{&db, &b}}) {
    std::printf(
        "%s: %zu files, %lld slices assembled into %zu gradients; %lld replica copies checked "
        "bitwise equal%s\n",
        d->side.c_str(), d->files, static_cast<long long>(s->slices), s->full.size(),
        static_cast<long long>(s->copies_checked),
        s->copy_example.empty() ? "" : (" (first: " + s->copy_example + ")").c_str());
  }
  double worst = 0;
  std::string worst_name;
  bool over = false;
  std::size_t compared = 0;
  for (const auto& [name, slices] : da.slices) {
    if (!db.slices.count(name)) {
      std::printf("gradient %s missing from the run\n", name.c_str());
      ++failures;
      continue;
    }
    if (!a.full.count(name) || !b.full.count(name)) continue;  // its assembly failed, already said
    const auto& ta = a.full.at(name);
    const auto& tb = b.full.at(name);
    if (ta.shape != tb.shape) {
      std::printf("FAIL: gradient %s: global shape %s in the reference, %s in the run\n",
                  name.c_str(), dims(ta.shape).c_str(), dims(tb.shape).c_str());
      ++failures;
      continue;
    }
    const double e = max_abs_diff(tb.values, ta.values) / (max_abs(ta.values) + 1e-12);
    ++compared;
    if (e > worst || worst_name.empty()) {
      worst = e;
      worst_name = name;
    }
    const double bar = o.bar_for(name);
    if (e > bar && !over) {
      std::printf(
          "FAIL: first gradient over the bar: %s (rel. error %.3e > %.1e) -> phase: backward or "
          "gradient "
          "sync\n",
          name.c_str(), e, bar);
      over = true;
      ++failures;
    }
  }
  for (const auto& [name, slices] : db.slices) {
    if (!da.slices.count(name)) {
      std::printf("gradient %s missing from the reference\n", name.c_str());
      ++failures;
    }
  }
  if (da.slices.empty()) {
    std::printf("FAIL: no gradients to compare in %s\n", (ref_dir + sub).c_str());
    ++failures;
  }
  std::printf("compared %zu gradients of step %lld, max relative error %.3e (%s; bar %.1e)\n",
              compared, static_cast<long long>(o.step), worst, worst_name.c_str(), o.bar_for(worst_name));
  return failures == 0 ? 0 : 1;
}

}  // namespace hp::compare
