#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "common/atomic_file.h"
#include "common/fault.h"
#include "common/json_reader.h"
#include "common/strings.h"
#include "models/model.h"
#include "checkpoint/manifest.h"
#include "pipeline/optimizer_state.h"
#include "pipeline/pipeline.h"
#include "checkpoint/shard.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace pipetrain::checkpoint {

using namespace ::pipetrain::job;  // the run layer below: configs and jobs

using pipeline::OptimizerInfo;
using pipeline::OptimizerKind;
using pipeline::ParamState;

namespace {

constexpr const char* kOptimizerPrefix = "optimizer/";
constexpr const char* kGeneratorKey = "rng/torch_cpu";

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}



// common/atomic_file.h, its errors as checkpoint errors.
void write_synced(const std::string& path, const char* data, size_t size) {
  try {
    write_file_synced(path, data, size);
  } catch (const IoError& e) {
    throw CheckpointError(e.what());
  }
}

void fsync_dir(const fs::path& dir) {
  try {
    fsync_directory(dir.string());
  } catch (const IoError& e) {
    throw CheckpointError(e.what());
  }
}

// A file of a checkpoint, read only if it is a regular file of at most `max_bytes` (`exact`: of
// exactly that many): a FIFO, a device (a link to /dev/zero), a directory or a file of another
// size is refused before anything is read, so nothing there can hang a load or grow it
// without bound.
std::vector<char> read_file(const std::string& path, uint64_t max_bytes, bool exact, const std::string& what) {
  // O_NONBLOCK: opening a FIFO with no writer returns at once (and is refused below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw CheckpointError("cannot read " + path + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw CheckpointError("cannot read " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw CheckpointError(what + " " + path + ": not a regular file (" +
                          (S_ISDIR(st.st_mode)    ? "a directory"
                           : S_ISFIFO(st.st_mode) ? "a FIFO"
                           : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                           : S_ISSOCK(st.st_mode) ? "a socket"
                                                  : "not a file") +
                          ")");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (exact ? size != max_bytes : size > max_bytes)
    throw CheckpointError(what + " " + path + ": " + std::to_string(size) + " bytes, " +
                          (exact ? "the manifest says " : "more than the most a manifest may hold, ") + std::to_string(max_bytes) +
                          (exact ? " (truncated or replaced)" : ""));
  std::vector<char> bytes(size);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, bytes.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw CheckpointError("cannot read " + path + ": " + (n < 0 ? std::strerror(errno) : "it shrank while read"));
    done += static_cast<size_t>(n);
  }
  return bytes;
}

constexpr uint64_t kMaxManifestBytes = uint64_t(64) << 20;

uint32_t crc_of(const std::vector<char>& bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  size_t done = 0;
  while (done < bytes.size()) {  // zlib takes uInt lengths
    const uInt n = static_cast<uInt>(std::min<size_t>(bytes.size() - done, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + done), n);
    done += n;
  }
  return static_cast<uint32_t>(crc);
}

// The first place where two JSON values differ, as "key.path: checkpoint X, config Y".
std::string first_difference(const json& saved, const json& now, const std::string& path) {
  if (saved.is_object() && now.is_object()) {
    for (auto it = saved.begin(); it != saved.end(); ++it) {
      const std::string p = path.empty() ? it.key() : path + "." + it.key();
      if (!now.contains(it.key())) return p + ": set in the checkpoint (" + brief(it.value()) + "), absent from the config";
      std::string d = first_difference(it.value(), now.at(it.key()), p);
      if (!d.empty()) return d;
    }
    for (auto it = now.begin(); it != now.end(); ++it)
      if (!saved.contains(it.key()))
        return (path.empty() ? it.key() : path + "." + it.key()) + ": absent from the checkpoint, " +
               brief(it.value()) + " in the config";
    return "";
  }
  if (saved != now) return path + ": " + brief(saved) + " in the checkpoint, " + brief(now) + " in the config";
  return "";
}

std::string shape_text(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

json read_manifest(const std::string& dir) {
  const fs::path file = fs::path(dir) / "manifest.json";
  if (!fs::exists(file))
    throw CheckpointError("checkpoint " + dir + ": no manifest.json (not a checkpoint, or a save that did not finish)");
  const std::vector<char> bytes = read_file(file.string(), kMaxManifestBytes, false, "checkpoint manifest");
  return check_manifest(std::string(bytes.begin(), bytes.end()), file.string(), fs::path(dir).filename().string());
}

// Every tensor of every shard, by name, after checking sizes and checksums.
// `order`, when given, receives the names in the order the shards hold them (the model's).
std::map<std::string, at::Tensor> read_shards(const std::string& dir, const json& manifest,
                                              std::vector<std::string>* order = nullptr) {
  std::map<std::string, at::Tensor> all;
  for (const json& s : manifest.at("shards")) {
    const std::string path = (fs::path(dir) / s.at("file").get<std::string>()).string();
    if (!fs::exists(path)) throw CheckpointError("checkpoint " + dir + ": shard " + path + " is missing");
    const std::vector<char> bytes = read_file(path, s.at("bytes").get<uint64_t>(), true, "checkpoint shard");
    if (crc_of(bytes) != s.at("crc32").get<uint32_t>())
      throw CheckpointError("checkpoint shard " + path + ": CRC-32 mismatch (the file is damaged)");
    for (auto& [name, tensor] : load_tensor_dict(bytes, path)) {
      if (!all.emplace(name, tensor).second)
        throw CheckpointError("checkpoint " + dir + ": tensor " + printable(name, 120) + " is in two shards");
      if (order) order->push_back(name);
    }
  }
  return all;
}

// Copies the named tensors `into` (parameters or buffers) from `saved`, checking every name,
// shape and dtype; names found are removed from `saved`.
void copy_named(const std::vector<std::pair<std::string, at::Tensor>>& into, std::map<std::string, at::Tensor>& saved,
                const std::string& dir) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : into) {
    auto it = saved.find(name);
    if (it == saved.end())
      throw CheckpointError("checkpoint " + dir + ": has no tensor " + name + " (the model has it, shape " + shape_text(t) + ")");
    const at::Tensor& v = it->second;
    if (v.sizes() != t.sizes())
      throw CheckpointError("checkpoint " + dir + ": " + name + " has shape " + shape_text(v) + ", the model " + shape_text(t));
    if (v.scalar_type() != t.scalar_type())
      throw CheckpointError("checkpoint " + dir + ": " + name + " is " + c10::toString(v.scalar_type()) + ", the model " +
                            c10::toString(t.scalar_type()));
    t.copy_(v);
    saved.erase(it);
  }
}

std::vector<std::pair<std::string, at::Tensor>> named_state(torch::nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value());
  for (const auto& b : m.named_buffers()) out.emplace_back(b.key(), b.value());
  return out;
}

void refuse_leftovers(const std::map<std::string, at::Tensor>& saved, const std::string& dir) {
  for (const auto& [name, t] : saved)
    if (name.rfind(kOptimizerPrefix, 0) != 0 && name != kGeneratorKey)
      throw CheckpointError("checkpoint " + dir + ": holds tensor " + name + " that the model does not have");
}

// The optimizer keys its per-parameter state by the parameter's TensorImpl.
void* state_key(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }

// Tied parameters (Pipeline::tied_names) are stored once, under the tie's first member: the
// followers' names are left out when saving, and filled from the first member's when loading.
using TiedNames = std::vector<std::pair<std::string, std::string>>;  // (follower, first member)

std::set<std::string> followers_of(const TiedNames& tied) {
  std::set<std::string> out;
  for (const auto& [follower, leader] : tied) out.insert(follower);
  return out;
}

void fill_tied(std::map<std::string, at::Tensor>& saved, const TiedNames& tied) {
  for (const auto& [follower, leader] : tied) {
    if (auto it = saved.find(leader); it != saved.end() && !saved.count(follower)) saved.emplace(follower, it->second);
    const std::string from = kOptimizerPrefix + leader + "/", to = kOptimizerPrefix + follower + "/";
    std::vector<std::pair<std::string, at::Tensor>> state;
    for (auto it = saved.lower_bound(from); it != saved.end() && it->first.rfind(from, 0) == 0; ++it)
      state.emplace_back(to + it->first.substr(from.size()), it->second);
    for (auto& entry : state) saved.insert(std::move(entry));
  }
}

void save_optimizer(torch::optim::Optimizer& opt, torch::nn::Module& layers, c10::Dict<std::string, at::Tensor>& d,
                    const std::set<std::string>& left_out) {
  for (const auto& p : layers.named_parameters()) {
    if (left_out.count(p.key())) continue;
    auto it = opt.state().find(state_key(p.value()));
    if (it == opt.state().end()) continue;
    const std::string base = kOptimizerPrefix + p.key() + "/";
    auto put = [&](const char* field, const at::Tensor& t) {
      if (t.defined()) d.insert(base + field, t.detach().cpu().contiguous());  // a GPU stage's too
    };
    ParamState state;
    try {
      state = pipeline::to_param_state(*it->second);
    } catch (const Error& e) {
      throw CheckpointError(std::string("checkpoints cover the optimizer state of ") + e.what());
    }
    if (pipeline::info(state.kind).counts_steps) put("step", torch::tensor(state.step, torch::kLong));
    for (const auto& [field, t] : state.tensors) put(field.c_str(), t);
  }
}

void load_optimizer(torch::optim::Optimizer& opt, OptimizerKind kind, torch::nn::Module& layers,
                    std::map<std::string, at::Tensor>& saved, const std::string& dir) {
  opt.state().clear();
  for (const auto& p : layers.named_parameters()) {
    const std::string base = kOptimizerPrefix + p.key() + "/";
    auto take = [&](const char* field) -> at::Tensor {
      auto it = saved.find(base + field);
      if (it == saved.end()) return {};
      at::Tensor t = it->second.clone();
      saved.erase(it);
      return t;
    };
    auto check = [&](const char* field, const at::Tensor& t) {
      if (t.defined() && t.sizes() != p.value().sizes())
        throw CheckpointError("checkpoint " + dir + ": " + base + field + " has shape " + shape_text(t) +
                              ", the parameter " + shape_text(p.value()));
      return t;
    };
    ParamState ps{kind, 0, {}};
    const OptimizerInfo& row = pipeline::info(kind);
    for (const std::string& field : row.fields)
      if (at::Tensor t = check(field.c_str(), take(field.c_str())); t.defined()) ps.tensors[field] = t;
    if (row.counts_steps) {
      const at::Tensor step = take("step");
      if (step.defined() && step.numel() != 1)
        throw CheckpointError("checkpoint " + dir + ": " + base + "step holds " + std::to_string(step.numel()) + " values");
      if (step.defined()) ps.step = step.item<int64_t>();
      else if (!ps.tensors.empty())
        throw CheckpointError("checkpoint " + dir + ": incomplete " + optimizer_name(row.kind) + " state for " + p.key() + ": no step");
    }
    std::unique_ptr<torch::optim::OptimizerParamState> state;
    try {
      state = pipeline::make_param_state(ps);
    } catch (const Error& e) {
      throw CheckpointError("checkpoint " + dir + ": " + e.what() + " for " + p.key());
    }
    if (!state) continue;
    opt.state()[state_key(p.value())] = std::move(state);
  }
}

}  // namespace

json training_identity(const Config& c) {
  const json& root = c.root;
  auto section = [&](const char* key) { return root.contains(key) ? root.at(key) : json::object(); };
  return json{{"model", c.model},
              {"data", section("data")},
              {"optimizer", section("optimizer")},
              {"seed", c.train.seed},
              {"accumulate", c.train.accumulate},
              {"dtype", choice_name(c.runtime.dtype)}};
}


namespace {
// The shards, the manifest and the rename of save_checkpoint, into `partial` (made by the writer).
std::string save_into(const fs::path& partial, const fs::path& root, const std::string& name, const Config& config,
                      Pipeline& pipe, int64_t step, int64_t batches, int keep, bool writer);
}  // namespace

std::string save_checkpoint(const std::string& root_dir, const Config& config, Pipeline& pipe, int64_t step,
                            int64_t batches, int keep) {
  // Multi-process: every rank writes the shards of its own stages into the partial directory
  // that rank 0 made; rank 0 writes the manifest from every rank's sizes and checksums and
  // renames the directory into place. The directory must be shared by all ranks.
  const bool writer = pipe.rank() <= 0;
  const fs::path root(root_dir);
  std::error_code ec;
  const std::string name = step_name(step);
  const fs::path partial = root / ("." + name + ".partial");
  if (writer) {
    fs::create_directories(root, ec);
    if (ec) throw CheckpointError("cannot create checkpoint directory " + root_dir + ": " + ec.message());
    fs::remove_all(partial, ec);
    if (!fs::create_directory(partial, ec) || ec)
      throw CheckpointError("cannot create " + partial.string() + ": " + ec.message());
  }
  try {
    return save_into(partial, root, name, config, pipe, step, batches, keep, writer);
  } catch (...) {
    // A failed save (a full disk, a peer gone) leaves nothing behind to fill the disk further:
    // the writer removes the partial directory (other ranks' writes into it fail with it).
    if (writer) fs::remove_all(partial, ec);
    throw;
  }
}

namespace {
std::string save_into(const fs::path& partial, const fs::path& root, const std::string& name, const Config& config,
                      Pipeline& pipe, int64_t step, int64_t batches, int keep, bool writer) {
  std::error_code ec;
  pipe.collectives().barrier("the checkpoint's directory");
  if (!fs::is_directory(partial))
    throw CheckpointError(detail::concat("rank ", pipe.rank(), ": cannot see ", partial.string(),
                                         ", made by rank 0 (checkpoint directories must be shared by all ranks)"));

  const int V = static_cast<int>(pipe.balance().size());
  std::vector<double> written;  // (virtual stage, bytes, crc32) of each shard this rank wrote
  for (int vs = 0; vs < V; ++vs) {
    if (!pipe.is_local_stage(vs)) continue;
    // Data parallelism: copy 0 writes its stages (every copy holds the same); a sharded
    // optimizer's state is gathered from every copy first, and written whole.
    std::unique_ptr<torch::optim::Optimizer> gathered = pipe.optimizers().gathered(vs);
    if (pipe.copy() != 0) continue;
    torch::nn::Sequential& layers = pipe.stage_layers(vs);
    c10::Dict<std::string, at::Tensor> d;
    const std::set<std::string> followers = followers_of(pipe.tied_names());
    for (auto& [n, t] : named_state(*layers))
      if (!followers.count(n)) d.insert(n, t.detach().cpu().contiguous());
    if (torch::optim::Optimizer* opt = gathered ? gathered.get() : pipe.optimizers().of(vs))
      save_optimizer(*opt, *layers, d, followers);
    if (vs == 0) {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      d.insert(kGeneratorKey, gen.get_state());
    }
    const std::vector<char> bytes = save_tensor_dict(d);
    const std::string file = "stage-" + std::to_string(vs) + ".pt";
    write_synced((partial / file).string(), bytes.data(), bytes.size());
    written.insert(written.end(), {double(vs), double(bytes.size()), double(crc_of(bytes))});
    fault_point("checkpoint.shard", pipe.collectives().rank(), step);  // common/fault.h
  }
  std::map<int, std::pair<uint64_t, uint32_t>> entries;
  for (const auto& part : pipe.collectives().all_gather(written, "the checkpoint shards"))
    for (size_t i = 0; i + 2 < part.size(); i += 3)
      entries[static_cast<int>(part[i])] = {static_cast<uint64_t>(part[i + 1]), static_cast<uint32_t>(part[i + 2])};
  if (static_cast<int>(entries.size()) != V)
    throw CheckpointError(detail::concat("checkpoint ", partial.string(), ": ", entries.size(), " of ", V, " shards were written"));
  if (!writer) {
    pipe.collectives().barrier("the checkpoint's rename");  // rank 0 has renamed it into place
    return (root / name).string();
  }
  json shards = json::array();
  for (const auto& [vs, e] : entries)
    shards.push_back({{"file", "stage-" + std::to_string(vs) + ".pt"},
                      {"bytes", e.first},
                      {"crc32", e.second},
                      {"layers", models::layer_names(pipe.stage_layers(vs))}});
  const json identity = training_identity(config);
  json manifest{{"step", step},
                      {"batches", batches},
                      {"pipeline_step", pipe.step()},
                      {"seed", config.train.seed},
                      {"stages", pipe.stages()},
                      {"chunks", V / pipe.stages()},
                      {"schedule", schedule::name(config.pipeline.schedule)},
                      {"balance", pipe.balance()},
                      {"optimizer", optimizer_name(config.optimizer.kind)},
                      {"precision", precision_name(config.train.precision)},
                      {"loss_scale", pipe.optimizers().loss_scale()},
                      {"loss_scale_good_steps", pipe.optimizers().loss_scale_good_steps()},
                      {"identity", identity},
                      {"identity_hash", identity_hash(identity)},
                      {"shards", shards}};
  seal_manifest(manifest);
  const std::string text = manifest.dump(2) + "\n";
  write_synced((partial / "manifest.json").string(), text.data(), text.size());
  fsync_dir(partial);

  // Into place: a checkpoint of the same step (a run resumed from an older one) is replaced.
  const fs::path final_dir = root / name;
  const fs::path replaced = root / ("." + name + ".replaced");
  if (fs::exists(final_dir)) {
    fs::remove_all(replaced, ec);
    fs::rename(final_dir, replaced, ec);
    if (ec) throw CheckpointError("cannot move " + final_dir.string() + " aside: " + ec.message());
  }
  fs::rename(partial, final_dir, ec);
  if (ec) throw CheckpointError("cannot rename " + partial.string() + " to " + final_dir.string() + ": " + ec.message());
  fsync_dir(root);
  fs::remove_all(replaced, ec);

  // Only complete checkpoints beyond the newest `keep`, and partial saves of crashed runs, go.
  std::vector<std::pair<int64_t, fs::path>> complete;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (step_of(n) >= 0 && fs::exists(e.path() / "manifest.json")) complete.emplace_back(step_of(n), e.path());
    if (n.size() > 9 && n[0] == '.' && n.rfind(".partial") == n.size() - 8 && e.path() != partial)
      fs::remove_all(e.path(), ec);
  }
  std::sort(complete.begin(), complete.end());
  for (size_t i = 0; keep > 0 && i + static_cast<size_t>(keep) < complete.size(); ++i)
    if (complete[i].second != final_dir) fs::remove_all(complete[i].second, ec);
  pipe.collectives().barrier("the checkpoint's rename");
  return final_dir.string();
}
}  // namespace

void check_checkpoint_dir(const std::string& root, const std::string& where) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw ConfigError(where + ": " + root + ": cannot create the directory (" + ec.message() + ")");
  if (!fs::is_directory(root)) throw ConfigError(where + ": " + root + ": not a directory");
  // Each rank probes with its own name: the ranks of one job may share the directory.
  const fs::path probe = fs::path(root) / (".probe-" + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw ConfigError(where + ": " + root + ": cannot write there (" + std::strerror(errno) + ")");
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int saved_errno = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote) throw ConfigError(where + ": " + root + ": cannot write there (" + std::strerror(saved_errno) + ")");
}

std::string latest_checkpoint(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return "";
  int64_t best = -1;
  std::string found;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t s = step_of(e.path().filename().string());
    if (s > best && fs::exists(e.path() / "manifest.json")) {
      best = s;
      found = e.path().string();
    }
  }
  return found;
}

std::string find_checkpoint(const std::string& path) {
  if (fs::exists(fs::path(path) / "manifest.json")) return path;
  if (!fs::exists(path)) throw CheckpointError("checkpoint " + path + ": no such file or directory");
  std::string latest = latest_checkpoint(path);
  if (latest.empty())
    throw CheckpointError("checkpoint " + path + ": holds no complete checkpoint (no step-N directory with a manifest.json)");
  return latest;
}

namespace {
CheckpointState state_of(const std::string& dir, const json& m) {
  CheckpointState s;
  s.dir = dir;
  s.step = m.at("step").get<int64_t>();
  s.batches = m.at("batches").get<int64_t>();
  s.pipeline_step = m.at("pipeline_step").get<int64_t>();
  s.stages = m.at("stages").get<int>();
  s.manifest = m;
  return s;
}
}  // namespace

CheckpointState load_checkpoint(const std::string& dir, const Config& config, Pipeline& pipe) {
  const json m = read_manifest(dir);
  const std::string diff = first_difference(m.at("identity"), training_identity(config), "");
  if (!diff.empty())
    throw CheckpointError("checkpoint " + dir + " was written by a different run: " + diff);
  std::map<std::string, at::Tensor> saved = read_shards(dir, m);
  fill_tied(saved, pipe.tied_names());
  const int V = static_cast<int>(pipe.balance().size());
  for (int vs = 0; vs < V; ++vs) {
    if (pipe.is_local_stage(vs)) {
      copy_named(named_state(*pipe.stage_layers(vs)), saved, dir);
      continue;
    }
    // Another rank's stage (its tensors are released here): that rank loads and checks its
    // tensors and optimizer state.
    for (const auto& [name, t] : named_state(*pipe.stage_layers(vs))) {
      saved.erase(name);
      const std::string state = kOptimizerPrefix + name + "/";
      for (auto it = saved.lower_bound(state); it != saved.end() && it->first.rfind(state, 0) == 0;) it = saved.erase(it);
    }
  }
  refuse_leftovers(saved, dir);
  OptimizerKind kind = config.optimizer.kind;
  try {
    kind = parse_optimizer(m.value("optimizer", std::string(optimizer_name(config.optimizer.kind))), "optimizer");
  } catch (const ConfigError& e) {
    throw CheckpointError("checkpoint " + dir + ": manifest: " + e.what());
  }
  bool optimizers = false;
  for (int vs = 0; vs < V; ++vs)
    if (auto full = pipe.optimizers().unsharded(vs)) {  // a sharded optimizer takes its slices
      load_optimizer(*full, kind, *pipe.stage_layers(vs), saved, dir);
      pipe.optimizers().scatter(vs, *full);
      optimizers = true;
    } else if (torch::optim::Optimizer* opt = pipe.optimizers().of(vs)) {
      load_optimizer(*opt, kind, *pipe.stage_layers(vs), saved, dir);
      optimizers = true;
    }
  for (const auto& [name, t] : saved)
    if (name.rfind(kOptimizerPrefix, 0) == 0 && optimizers)
      throw CheckpointError("checkpoint " + dir + ": optimizer state " + name + " belongs to no parameter of the model");
  if (auto it = saved.find(kGeneratorKey); it != saved.end()) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    try {
      gen.set_state(it->second);
    } catch (const c10::Error& e) {
      throw CheckpointError("checkpoint " + dir + ": the generator state cannot be restored (" + e.what_without_backtrace() + ")");
    }
  }
  pipe.sync_copies();  // data parallelism: every copy (and a sharded optimizer's slice) follows
  pipe.set_step(m.at("pipeline_step").get<int64_t>());
  // fp16 continues with the loss scale it had; from another precision it starts afresh.
  if (config.train.precision == Precision::FP16 && m.value("precision", "fp32") == "fp16")
    pipe.optimizers().restore_loss_scale(m.at("loss_scale").get<double>(), m.at("loss_scale_good_steps").get<int64_t>());
  return state_of(dir, m);
}

CheckpointState load_weights(const std::string& dir, const Config& config, torch::nn::Sequential& model,
                             const std::vector<models::Tie>& ties) {
  const json m = read_manifest(dir);
  json saved_model{{"model", checkpoint_model(dir)}}, now{{"model", config.model}};
  const std::string diff = first_difference(saved_model, now, "");
  if (!diff.empty()) throw CheckpointError("checkpoint " + dir + " holds a different model: " + diff);
  std::map<std::string, at::Tensor> saved = read_shards(dir, m);
  TiedNames tied;
  const auto names = models::layer_names(model);
  for (const models::Tie& tie : ties)
    for (size_t i = 1; i < tie.size(); ++i)
      tied.emplace_back(names.at(tie[i].layer) + "." + tie[i].name, names.at(tie[0].layer) + "." + tie[0].name);
  fill_tied(saved, tied);
  copy_named(named_state(*model), saved, dir);
  refuse_leftovers(saved, dir);
  return state_of(dir, m);
}

json checkpoint_model(const std::string& dir) {
  const json identity = read_manifest(dir).at("identity");
  if (!identity.contains("model")) throw CheckpointError("checkpoint " + dir + ": the manifest's identity has no model");
  return identity.at("model");
}

std::vector<std::pair<std::string, at::Tensor>> checkpoint_weights(const std::string& dir) {
  std::vector<std::string> order;  // shards in stage order hold the layers in model order
  std::map<std::string, at::Tensor> saved = read_shards(dir, read_manifest(dir), &order);
  std::vector<std::pair<std::string, at::Tensor>> weights;
  for (const std::string& name : order)
    if (name.rfind(kOptimizerPrefix, 0) != 0 && name != kGeneratorKey) weights.emplace_back(name, saved.at(name));
  return weights;
}

size_t export_checkpoint(const std::string& dir, const std::string& out) {
  c10::Dict<std::string, at::Tensor> d;
  for (const auto& [name, t] : checkpoint_weights(dir)) d.insert(name, t);
  const std::vector<char> bytes = save_tensor_dict(d);
  try {
    write_file_atomically(out, bytes.data(), bytes.size());
  } catch (const IoError& e) {
    throw CheckpointError(e.what());
  }
  return d.size();
}

}  // namespace pipetrain::checkpoint
