#include "plugins/pipeline_parallel/stage_link.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstring>
#include <stdexcept>

#include "hp/comm/group.h"
#include "hp/profile/trace.h"

namespace hp::pipeline {

namespace {

constexpr int kData = 0, kHeader = 1, kDataAfterHeader = 2;
constexpr std::int64_t kChanged = -1;

std::int64_t bytes_of(const TensorMeta& m) {
  return numel(m) * static_cast<std::int64_t>(c10::elementSize(static_cast<c10::ScalarType>(m.dtype)));
}

std::int64_t payload_bytes(const std::vector<TensorMeta>& metas) {
  std::int64_t n = 0;
  for (const auto& m : metas) n += bytes_of(m);
  return n;
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::vector<TensorMeta> describe_activations(const Activations& a) {
  std::vector<TensorMeta> out;
  for (const auto& item : a) {
    const at::Tensor& t = item.value();
    out.push_back({item.key(), static_cast<int>(t.scalar_type()), t.sizes().vec()});
  }
  return out;
}

StageLink::StageLink(dist::Group& pp, int chunks, int stage) : pp_(pp), chunks_(chunks), stage_(stage) {}

StageLink::~StageLink() = default;

int StageLink::tag(const MessageId& id, int kind) const {
  // Unique within a step for every (micro-batch, boundary, direction, kind).
  return ((id.mb * chunks_ + id.boundary) * 2 + static_cast<int>(id.dir)) * 3 + kind;
}

std::string StageLink::describe(const MessageId& id, int peer) const {
  const bool fwd = id.dir == Direction::kForward;
  return "pipeline stage " + std::to_string(stage_) + " waiting for the " +
         (fwd ? "activations" : "gradients") + " of micro-batch " + std::to_string(id.mb) + " from stage " +
         std::to_string(peer) + " (" + (fwd ? "forward of chunk " + std::to_string(id.boundary)
                                           : "backward of chunk " + std::to_string(id.boundary + 1)) +
         ")";
}

void StageLink::post(const at::Tensor& buf, int peer, int t) {
  if (peer == pp_.rank()) {
    local_[t] = buf;
    return;
  }
  in_flight_.push_back(pp_.isend(buf, peer, t));
}

at::Tensor StageLink::take(int peer, int t, std::int64_t bytes, const MessageId& id, const char* what) {
  if (peer == pp_.rank()) {
    auto it = local_.find(t);
    if (it == local_.end()) {
      throw std::logic_error("internal error: " + describe(id, peer) + ": no local " + what + ", please report");
    }
    at::Tensor out = it->second;
    local_.erase(it);
    return out;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto posted = posted_.find(t);
  if (posted != posted_.end()) {
    std::unique_ptr<dist::Work> w = std::move(posted->second);
    posted_.erase(posted);
    at::Tensor buf;
    try {
      buf = w->wait();
    } catch (const std::exception& e) {
      throw dist::CommError(describe(id, peer) + ", " + what + ": " + e.what());
    }
    if (buf.numel() != bytes) {
      throw std::logic_error("internal error: " + describe(id, peer) + ": a receive of " +
                             std::to_string(buf.numel()) + " bytes was posted for a message of " +
                             std::to_string(bytes) + ", please report");
    }
    wait_seconds_ += since(t0);
    return buf;
  }
  at::Tensor buf = at::empty({bytes}, at::kByte);
  try {
    pp_.recv(buf, peer, t);
  } catch (const std::exception& e) {
    throw dist::CommError(describe(id, peer) + ", " + what + ": " + e.what());
  }
  wait_seconds_ += since(t0);
  return buf;
}

void StageLink::send(const Activations& a, int peer, const MessageId& id) {
  auto metas = describe_activations(a);
  Channel& ch = send_channels_[{static_cast<int>(id.dir), id.boundary}];
  int data_kind = kData;
  if (ch.generation == 0 || metas != ch.metas) {
    if (ch.generation > 0) {
      // The receiver expects the old size: tell it a new header follows.
      at::Tensor marker = at::zeros({ch.payload_bytes + 8}, at::kByte);
      std::memcpy(marker.data_ptr<std::uint8_t>() + ch.payload_bytes, &kChanged, 8);
      post(marker, peer, tag(id, kData));
      data_kind = kDataAfterHeader;
    }
    ch.metas = metas;
    ch.generation += 1;
    ch.payload_bytes = payload_bytes(metas);
    auto words = encode_header(metas, ch.generation);
    post(at::tensor(words, at::kLong), peer, tag(id, kHeader));
    headers_sent_ += 1;
  }
  at::Tensor buf = at::empty({ch.payload_bytes + 8}, at::kByte);
  auto* p = buf.data_ptr<std::uint8_t>();
  std::int64_t off = 0;
  for (const auto& item : a) {
    at::Tensor t = item.value().detach().contiguous();
    const auto n = static_cast<std::int64_t>(t.numel() * t.element_size());
    std::memcpy(p + off, t.data_ptr(), static_cast<std::size_t>(n));
    off += n;
  }
  std::memcpy(p + off, &ch.generation, 8);
  post(buf, peer, tag(id, data_kind));
}

Activations StageLink::recv(int peer, const MessageId& id) {
  profile::Span span("pipeline", "stage_recv");
  if (span.active()) {
    span.arg("direction", id.dir == Direction::kForward ? "forward" : "backward")
        .arg("boundary", id.boundary)
        .arg("mb", id.mb)
        .arg("peer", peer);
  }
  Channel& ch = recv_channels_[{static_cast<int>(id.dir), id.boundary}];
  auto read_header = [&] {
    at::Tensor h = take(peer, tag(id, kHeader), static_cast<std::int64_t>(kHeaderWords * 8), id, "header");
    // Bytes from a peer, the sender's int64 words from this same stage.
    const auto* w = static_cast<const std::int64_t*>(h.data_ptr());
    std::vector<std::int64_t> words(w, w + kHeaderWords);
    ch.metas = decode_header(words, &ch.generation);
    ch.payload_bytes = payload_bytes(ch.metas);
  };
  if (ch.generation == 0) read_header();
  at::Tensor buf = take(peer, tag(id, kData), ch.payload_bytes + 8, id, "data");
  std::int64_t trailer;
  std::memcpy(&trailer, buf.data_ptr<std::uint8_t>() + ch.payload_bytes, 8);
  if (trailer == kChanged) {
    read_header();
    buf = take(peer, tag(id, kDataAfterHeader), ch.payload_bytes + 8, id, "data");
    std::memcpy(&trailer, buf.data_ptr<std::uint8_t>() + ch.payload_bytes, 8);
  }
  if (trailer != ch.generation) {
    throw std::runtime_error(describe(id, peer) + ": message of header generation " + std::to_string(trailer) +
                             ", expected " + std::to_string(ch.generation) + " (stages out of step)");
  }
  Activations out;
  const auto* p = buf.data_ptr<std::uint8_t>();
  std::int64_t off = 0;
  for (const auto& m : ch.metas) {
    at::Tensor t = at::empty(m.shape, at::TensorOptions().dtype(static_cast<c10::ScalarType>(m.dtype)));
    const auto n = bytes_of(m);
    std::memcpy(t.data_ptr(), p + off, static_cast<std::size_t>(n));
    off += n;
    out.insert(m.name, t);
  }
  return out;
}

void StageLink::prepost(int peer, const MessageId& id) {
  if (peer == pp_.rank()) return;
  const auto ch = recv_channels_.find({static_cast<int>(id.dir), id.boundary});
  if (ch == recv_channels_.end() || ch->second.generation == 0) return;
  const int t = tag(id, kData);
  if (posted_.count(t)) return;
  posted_[t] = pp_.irecv(at::empty({ch->second.payload_bytes + 8}, at::kByte), peer, t);
}

void StageLink::reap() {
  std::vector<std::unique_ptr<dist::Work>> still;
  for (auto& s : in_flight_) {
    if (!s->completed()) still.push_back(std::move(s));
  }
  in_flight_ = std::move(still);
}

void StageLink::wait_all() {
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& s : in_flight_) s->wait();
  in_flight_.clear();
  wait_seconds_ += since(t0);
}

double StageLink::take_wait_seconds() {
  const double s = wait_seconds_;
  wait_seconds_ = 0;
  return s;
}

}  // namespace hp::pipeline
