// TensorBoard event files (train/tensorboard.h).
#include "train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "common/strings.h"
#include "pipeline/step_trace.h"

namespace pipetrain::job {}
namespace pipetrain::checkpoint {}
namespace pipetrain::planner {}

namespace pipetrain::train {

using namespace ::pipetrain::job;         // configs and jobs
using namespace ::pipetrain::checkpoint;  // checkpoints
using namespace ::pipetrain::planner;     // plans and predictions

namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli polynomial
      t[i] = c;
    }
    return t;
  }();
  return table;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// Protocol buffer wire format: varints, and fields tagged (number << 3 | wire type).
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, int field, int wire) { varint(out, static_cast<uint64_t>(field) << 3 | wire); }
template <typename T>
void fixed(std::string& out, int field, T v) {  // wire type 1 (64-bit) or 5 (32-bit), little-endian
  key(out, field, sizeof(T) == 8 ? 1 : 5);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void bytes(std::string& out, int field, const std::string& v) {
  key(out, field, 2);
  varint(out, v.size());
  out += v;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
std::string event(int64_t step, const std::string* file_version, const std::string* summary) {
  std::string e;
  fixed<double>(e, 1, now_s());
  key(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  if (file_version) bytes(e, 3, *file_version);
  if (summary) bytes(e, 5, *summary);
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto& t = crc_table();
  uint32_t c = 0xffffffffu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw ConfigError("tensorboard directory " + dir + ": cannot create it (" + ec.message() + ")");
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  path_ =
      detail::concat(dir, "/events.out.tfevents.", static_cast<int64_t>(now_s()), ".", host, ".", ::getpid());
  out_.open(path_, std::ios::out | std::ios::binary | std::ios::trunc);
  if (!out_) throw ConfigError("tensorboard directory " + dir + ": cannot write " + path_);
  const std::string version = "brain.Event:2";
  record(event(0, &version, nullptr));
  flush();
}

void EventWriter::record(const std::string& e) {
  const uint64_t n = e.size();
  char head[12];
  std::memcpy(head, &n, 8);
  const uint32_t head_crc = masked(crc32c(head, 8));
  std::memcpy(head + 8, &head_crc, 4);
  pending_.append(head, 12);
  pending_ += e;
  const uint32_t crc = masked(crc32c(e.data(), e.size()));
  pending_.append(reinterpret_cast<const char*>(&crc), 4);
}

void EventWriter::scalar(const std::string& tag, int64_t step, double value) {
  // Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
  std::string v;
  bytes(v, 1, tag);
  fixed<float>(v, 2, static_cast<float>(value));
  std::string summary;
  bytes(summary, 1, v);
  record(event(step, nullptr, &summary));
}

void EventWriter::flush() {
  out_ << pending_;
  pending_.clear();
  if (!out_.flush()) throw Error("tensorboard: writing " + path_ + " failed");
}

void TensorBoardLog::stepped(const StepReport& r) {
  writer_.scalar("train/loss", r.step, r.loss);
  writer_.scalar("train/lr", r.step, r.lr);
  writer_.scalar("train/grad_norm", r.step, r.grad_norm);
  writer_.scalar("train/samples_per_s", r.step,
                 r.step_s > 0 ? static_cast<double>(r.samples) / r.step_s : 0.0);
  writer_.scalar("train/step_time_s", r.step, r.step_s);
  writer_.scalar("train/loss_scale", r.step, r.loss_scale);
  for (size_t s = 0; s < r.stage_busy_ms.size(); ++s)
    writer_.scalar(detail::concat("stages/busy_ms/", s), r.step, r.stage_busy_ms[s]);
  if (r.trace) writer_.scalar("stages/bubble", r.step, pipeline::bubble(*r.trace));
  for (size_t d = 0; d < r.device_peak_bytes.size(); ++d)
    writer_.scalar(detail::concat("memory/peak_mib/", d), r.step,
                   static_cast<double>(r.device_peak_bytes[d]) / (1 << 20));
  writer_.flush();
}

void TensorBoardLog::test_scalars(int64_t step, const TrainResult& result) {
  if (result.test_samples <= 0) return;
  writer_.scalar("test/loss", step, result.test_loss);
  writer_.scalar("test/accuracy", step, result.test_accuracy);
  if (result.language_model) writer_.scalar("test/perplexity", step, std::exp(result.test_loss));
  writer_.flush();
}

void TensorBoardLog::evaluated(int64_t step, const TrainResult& result) { test_scalars(step, result); }

void TensorBoardLog::tested(const TrainResult& result) {
  test_scalars(result.first_step + static_cast<int64_t>(result.losses.size()), result);
}

}  // namespace pipetrain::train
