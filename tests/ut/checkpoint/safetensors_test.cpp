// The safetensors writer and reader: every dtype round trips bitwise, the
// header is byte for byte what Python's safetensors expects, and every damaged
// file is refused with a message naming it.
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>
#include <set>

#include "tests/ut/checkpoint/test_util.h"

namespace hp::ckpt::test {
namespace {

using nlohmann::json;

struct DtypeCase {
  at::ScalarType type;
  const char* name;
};

class SafetensorsDtype : public ::testing::TestWithParam<DtypeCase> {};

std::string header_of(const std::string& path, std::uint64_t* length = nullptr) {
  const std::string bytes = read_bytes(path);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (length != nullptr) {
    *length = n;
  }
  return bytes.substr(8, n);
}

/// Writes a file whose header is `header` (as given) followed by `data_bytes` zero bytes.
void write_raw(const std::string& path, const std::string& header, std::size_t data_bytes) {
  const std::uint64_t n = header.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  bytes += header;
  bytes.append(data_bytes, '\0');
  write_bytes(path, bytes);
}


}  // namespace

TEST_P(SafetensorsDtype, RoundTripsBitwiseIncludingScalarAndEmpty) {
  const auto [type, name] = GetParam();
  TempDir dir;
  const auto path = dir / "t.safetensors";
  const auto matrix = sample({3, 5}, type);
  const auto scalar = sample({}, type, 11);
  const auto empty = sample({0, 4}, type);
  const auto written =
      write_safetensors(path, {{"matrix", matrix}, {"scalar", scalar}, {"empty", empty}});
  ASSERT_EQ(written.size(), 3u);

  SafetensorsReader reader(path);
  EXPECT_EQ(reader.names(), (std::vector<std::string>{"matrix", "scalar", "empty"}));
  EXPECT_TRUE(bitwise_equal(reader.read("matrix"), matrix));
  EXPECT_TRUE(bitwise_equal(reader.read("scalar"), scalar));
  EXPECT_EQ(reader.read("scalar").dim(), 0);
  EXPECT_TRUE(bitwise_equal(reader.read("empty"), empty));
  EXPECT_EQ(reader.entry("matrix").dtype, type);
  EXPECT_EQ(safetensors_dtype_name(type).value(), name);
  EXPECT_EQ(json::parse(header_of(path))["matrix"]["dtype"], name);
  // The returned ranges are absolute and their checksums are XXH64 of the bytes.
  const std::string bytes = read_bytes(path);
  for (const auto& w : written) {
    EXPECT_EQ(w.begin, reader.entry(w.name).begin);
    EXPECT_EQ(w.end, reader.entry(w.name).end);
    EXPECT_EQ(w.xxh64, XXH64(bytes.data() + w.begin, w.end - w.begin, 0));
  }
  EXPECT_EQ(written.back().end, bytes.size());
}

INSTANTIATE_TEST_SUITE_P(
    AllDtypes, SafetensorsDtype,
    ::testing::Values(DtypeCase{at::kDouble, "F64"}, DtypeCase{at::kFloat, "F32"},
                      DtypeCase{at::kHalf, "F16"}, DtypeCase{at::kBFloat16, "BF16"},
                      DtypeCase{at::kLong, "I64"}, DtypeCase{at::kInt, "I32"},
                      DtypeCase{at::kShort, "I16"}, DtypeCase{at::kChar, "I8"},
                      DtypeCase{at::kByte, "U8"}, DtypeCase{at::kBool, "BOOL"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Safetensors, HeaderIsWhatPythonSafetensorsReads) {
  TempDir dir;
  const auto path = dir / "py.safetensors";
  const auto b = torch::arange(6, torch::kFloat).reshape({2, 3});
  const auto a = torch::tensor(std::vector<std::int64_t>{1, -2, 3, 1LL << 40});
  write_safetensors(path, {{"b", b}, {"a", a}, {"s", torch::tensor(2.5, torch::kDouble)}},
                    {{"format", "pt"}});
  const std::string bytes = read_bytes(path);
  std::uint64_t n = 0;
  const std::string header = header_of(path, &n);

  // 8-byte little-endian length, spelled out byte by byte.
  std::uint64_t le = 0;
  for (int i = 7; i >= 0; --i) {
    le = (le << 8) | static_cast<unsigned char>(bytes[i]);
  }
  EXPECT_EQ(le, n);
  EXPECT_EQ(n % 8, 0u) << "header padded to 8 bytes like the reference writer";
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find_first_not_of(' ', header.find_last_of('}') + 1), std::string::npos);

  const json h = json::parse(header);
  std::set<std::string> keys;
  for (const auto& [k, v] : h.items()) {
    keys.insert(k);
  }
  EXPECT_EQ(keys, (std::set<std::string>{"__metadata__", "a", "b", "s"}));
  EXPECT_EQ(h["__metadata__"], json({{"format", "pt"}}));
  for (const auto* name : {"a", "b", "s"}) {
    std::set<std::string> entry_keys;
    for (const auto& [k, v] : h[name].items()) {
      entry_keys.insert(k);
    }
    EXPECT_EQ(entry_keys, (std::set<std::string>{"dtype", "shape", "data_offsets"})) << name;
  }
  EXPECT_EQ(h["b"]["dtype"], "F32");
  EXPECT_EQ(h["b"]["shape"], json({2, 3}));
  EXPECT_EQ(h["b"]["data_offsets"], json({0, 24}));
  EXPECT_EQ(h["a"]["dtype"], "I64");
  EXPECT_EQ(h["a"]["shape"], json({4}));
  EXPECT_EQ(h["a"]["data_offsets"], json({24, 56}));
  EXPECT_EQ(h["s"]["dtype"], "F64");
  EXPECT_EQ(h["s"]["shape"], json::array());
  EXPECT_EQ(h["s"]["data_offsets"], json({56, 64}));
  // The data is packed and ends the file, as the reference reader demands.
  EXPECT_EQ(bytes.size(), 8 + n + 64);
  float first_floats[6];
  std::memcpy(first_floats, bytes.data() + 8 + n, sizeof first_floats);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(first_floats[i], static_cast<float>(i));
  }
  std::int64_t big = 0;
  std::memcpy(&big, bytes.data() + 8 + n + 24 + 3 * 8, 8);
  EXPECT_EQ(big, 1LL << 40);
}

TEST(Safetensors, NoMetadataKeyWhenMetadataIsEmpty) {
  TempDir dir;
  const auto path = dir / "m.safetensors";
  write_safetensors(path, {{"x", torch::ones({2})}});
  EXPECT_FALSE(json::parse(header_of(path)).contains("__metadata__"));
  EXPECT_TRUE(SafetensorsReader(path).metadata().empty());
}

TEST(Safetensors, NonContiguousTensorsAndByteRanges) {
  TempDir dir;
  const auto path = dir / "nc.safetensors";
  const auto base = torch::arange(12, torch::kFloat).reshape({3, 4});
  const auto written = write_safetensors(path, {{"t", base.t()}, {"col", base.select(1, 2)}});
  SafetensorsReader reader(path);
  EXPECT_TRUE(bitwise_equal(reader.read("t"), base.t().contiguous()));
  EXPECT_TRUE(bitwise_equal(reader.read("col"), base.select(1, 2).contiguous()));
  // A byte range is read as any shape that fits it exactly.
  const auto& e = reader.entry("t");
  EXPECT_TRUE(bitwise_equal(reader.read_range(e.begin, e.end, at::kFloat, {12}),
                            base.t().contiguous().reshape({12})));
  EXPECT_TRUE(bitwise_equal(reader.read_range(e.begin + 4, e.begin + 12, at::kFloat, {2}),
                            torch::tensor({4.0F, 8.0F})));
  EXPECT_NE(error_of([&] {
              reader.read_range(e.begin, e.end, at::kFloat, {5});
            }).find("does not hold shape [5]"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { reader.read("nope"); }).find("no tensor 'nope' in safetensors file " + path),
      std::string::npos);
}

TEST(Safetensors, WriterRefusesWhatItCannotStore) {
  TempDir dir;
  const auto path = dir / "bad.safetensors";
  auto msg = error_of([&] {
    write_safetensors(path, {{"z", torch::ones({2}, torch::kComplexFloat)}});
  });
  EXPECT_NE(msg.find("cannot write tensor 'z' to " + path), std::string::npos) << msg;
  EXPECT_NE(msg.find("is not supported (supported: F64, F32"), std::string::npos) << msg;
  msg = error_of([&] {
    write_safetensors(path, {{"x", torch::ones({1})}, {"x", torch::ones({1})}});
  });
  EXPECT_NE(msg.find("'x'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("appears twice"), std::string::npos) << msg;
  msg = error_of([&] { write_safetensors(path, {{"__metadata__", torch::ones({1})}}); });
  EXPECT_NE(msg.find("not \"__metadata__\""), std::string::npos) << msg;
}

TEST(Safetensors, FileShorterThanTheLengthIsABadHeaderLength) {
  TempDir dir;
  const auto path = dir / "short.safetensors";
  write_bytes(path, "abc");
  const auto msg = error_of([&] { SafetensorsReader r(path); });
  EXPECT_NE(msg.find("bad header length in safetensors file " + path), std::string::npos) << msg;
  EXPECT_NE(msg.find("has 3 bytes"), std::string::npos) << msg;
}

TEST(Safetensors, AbsurdHeaderLengthIsABadHeaderLength) {
  TempDir dir;
  const auto path = dir / "huge.safetensors";
  std::uint64_t n = 1ULL << 40;
  write_bytes(path, std::string(reinterpret_cast<const char*>(&n), 8) + std::string(64, ' '));
  const auto msg = error_of([&] { SafetensorsReader r(path); });
  EXPECT_NE(msg.find("bad header length in safetensors file " + path + ": 1099511627776"),
            std::string::npos)
      << msg;
}

TEST(Safetensors, HeaderPastEndOfFile) {
  TempDir dir;
  const auto path = dir / "cut.safetensors";
  write_safetensors(path, {{"x", torch::ones({4})}});
  std::uint64_t n = 0;
  header_of(path, &n);
  fs::resize_file(path, 8 + n / 2);
  const auto msg = error_of([&] { SafetensorsReader r(path); });
  EXPECT_NE(msg.find("header past end of file in safetensors file " + path), std::string::npos)
      << msg;
}

TEST(Safetensors, DataPastEndOfFileIsTruncated) {
  TempDir dir;
  const auto path = dir / "trunc.safetensors";
  write_safetensors(path, {{"first", torch::ones({4})}, {"second", torch::ones({4})}});
  fs::resize_file(path, fs::file_size(path) - 1);
  const auto msg = error_of([&] { SafetensorsReader r(path); });
  EXPECT_NE(msg.find("safetensors file " + path + " is truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor 'second'"), std::string::npos) << msg;
}

TEST(Safetensors, UnknownDtype) {
  TempDir dir;
  const auto path = dir / "f8.safetensors";
  write_raw(path, R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2);
  const auto msg = error_of([&] { SafetensorsReader r(path); });
  EXPECT_NE(msg.find("unknown dtype 'F8_E4M3' for tensor 'w' in safetensors file " + path),
            std::string::npos)
      << msg;
}

TEST(Safetensors, HeaderThatIsNotJsonOrMisdescribesItsData) {
  TempDir dir;
  const auto path = dir / "junk.safetensors";
  write_raw(path, "{not json", 0);
  auto msg = error_of([&] { SafetensorsReader r(path); });
  EXPECT_NE(msg.find("bad header in safetensors file " + path + ": not valid JSON"),
            std::string::npos)
      << msg;
  write_raw(path, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  msg = error_of([&] { SafetensorsReader r(path); });
  EXPECT_NE(msg.find("bad data_offsets for tensor 'w' in safetensors file " + path),
            std::string::npos)
      << msg;
}

}  // namespace hp::ckpt::test
