#include "job/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "comm/backend.h"
#include "common/error.h"
#include "common/json_reader.h"
#include "common/option.h"
#include "common/strings.h"
#include "schedule/schedule.h"
#include "stages/device.h"

namespace pipetrain::job {

using nlohmann::json;

std::string Config::where(const std::string& key_path) const { return where_of(key_path, source, origins.get()); }

void apply_overrides(json& root, const std::vector<std::string>& overrides, Origins& origins) {
  for (const auto& full_text : overrides) {
    const std::string text = option(Option::Override) + " " + printable(full_text, 120);  // as messages show it
    const auto eq = full_text.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ConfigError(text + ": expected key.path=value");
    const std::string path = full_text.substr(0, eq), raw = full_text.substr(eq + 1);
    json value;
    try {
      value = parse_json(raw, text);
    } catch (const ConfigError& e) {
      // Bare words are strings (data.kind=synthetic); JSON nested too deep is an error.
      if (std::string(e.what()).find(": nested deeper than ") != std::string::npos) throw;
      value = raw;
    }
    json* node = &root;
    size_t start = 0;
    std::string reader_path;  // as the config's readers spell it: model.layers[7].in_features
    for (;;) {
      const auto dot = path.find('.', start);
      const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (key.empty()) throw ConfigError(text + ": empty key in '" + path + "'");
      json* next = nullptr;
      if (node->is_array()) {  // a list's element by its index: model.layers.7.in_features
        const bool digits = key.size() <= 9 && key.find_first_not_of("0123456789") == std::string::npos;
        const size_t i = digits ? std::stoul(key) : node->size();
        if (i >= node->size())
          throw ConfigError(detail::concat(text, ": ", path.substr(0, start ? start - 1 : 0), " is a list of ", node->size(),
                                           ": '", key, "' is not one of its indices"));
        reader_path += "[" + key + "]";
        if (dot == std::string::npos) {
          (*node)[i] = value;
          break;
        }
        next = &(*node)[i];
      } else if (!node->is_object()) {
        throw ConfigError(text + ": " + path.substr(0, start ? start - 1 : 0) + " is not an object");
      } else {
        reader_path += (reader_path.empty() ? "" : ".") + key;
        if (dot == std::string::npos) {
          (*node)[key] = value;
          break;
        }
        next = &(*node)[key];
        if (next->is_null()) *next = json::object();
      }
      node = next;
      start = dot + 1;
    }
    origins[reader_path] = text;
  }
}

namespace {
bool frozen_dtype_set(const Config& c) {
  return c.model.is_object() && c.model.contains("frozen_dtype") && c.model["frozen_dtype"] != "fp32";
}
}  // namespace

Config with_precision(const Config& c, Precision p) {
  Config out = c;
  out.train.precision = p;
  if (frozen_dtype_set(c)) {
    out.model["frozen_dtype"] = precision_name(p);
    if (out.root.contains("model")) out.root["model"]["frozen_dtype"] = precision_name(p);
  }
  return out;
}

std::vector<std::string> precision_overrides(const Config& c, const std::string& precision) {
  std::vector<std::string> sets{"train.precision=" + precision};
  if (frozen_dtype_set(c)) sets.push_back("model.frozen_dtype=" + precision);
  return sets;
}

int intra_op_threads(const RuntimeConfig& runtime, int stages) {
  if (runtime.intra_op_threads > 0) return runtime.intra_op_threads;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, stages));
}

namespace {

// A closed set's value under `key`, by its name in the set's table (job/choices.h); an unknown
// name is an error naming the key and listing the table's names.
template <class E>
E read_choice(JsonReader& r, const std::string& key, E def) {
  return *find_choice<E>(r.get_choice(key, choice_name(def), choice_names<E>(true)));
}

void read_data(JsonReader& top, DataConfig& d) {
  JsonReader data = top.child("data");
  d.kind = read_choice(data, "kind", d.kind);
  d.batch_size = data.get_int("batch_size", d.batch_size, 1, 1 << 24);
  const bool tokens = d.kind == DataKind::Tokens;
  const bool path_required = d.kind == DataKind::Text || d.kind == DataKind::Tensors || tokens;
  d.path = data.get_string("path", path_required ? "" : d.path);
  if (path_required && d.path.empty())
    data.fail("path", std::string("is required for data.kind ") + choice_name(d.kind) + " (it needs " + choice(d.kind).needs + ")");
  d.samples = data.get_int("samples", d.samples, 1, int64_t(1) << 32);
  d.test_samples = data.get_int("test_samples", d.test_samples, 0, int64_t(1) << 32);
  d.test_fraction = data.get_number("test_fraction", d.test_fraction, 0.0, 1.0);
  if (d.test_fraction <= 0.0 || d.test_fraction >= 1.0)
    data.fail("test_fraction", detail::concat("must be between 0 and 1 (exclusive), got ", d.test_fraction));
  d.stride = data.get_int("stride", d.stride, 0, int64_t(1) << 40);
  // Keys of data.kind tokens alone: elsewhere they would be silently unused.
  for (const char* key : {"test_path", "dtype"})
    if (!tokens && data.has(key)) data.fail(key, "is read by data.kind tokens only");
  d.test_path = data.get_string("test_path", "");
  if (tokens && data.has("test_path") && d.test_path.empty()) data.fail("test_path", "is empty (leave it out to test on data.test_fraction of data.path)");
  if (!d.test_path.empty() && data.has("test_fraction"))
    data.fail("test_fraction", "is not used with data.test_path (that file is the test split)");
  if (data.has("dtype")) d.dtype = read_choice(data, "dtype", TokenDType::Uint16);  // a .npy says its own
  d.drop_last = data.get_bool("drop_last", d.drop_last);
  data.finish();
}

// pipeline.balance: a method's name or a list of layer counts per virtual stage.
void read_balance(JsonReader& pipe, PipelineConfig& p) {
  const json* b = pipe.get_raw("balance");
  if (!b) return;
  const std::vector<std::string> methods = choice_names<BalanceMethod>(true);
  if (b->is_string()) {
    const std::string name = b->get<std::string>();
    if (auto m = find_choice<BalanceMethod>(name)) {
      p.balance_method = *m;
      return;
    }
    std::string hint = nearest(name, methods);
    pipe.fail("balance", "unknown method \"" + printable(name, 60) + "\"" +
                             (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)") + "; use one of " +
                             join(methods, ", ") + " or a list of layer counts");
  }
  if (!b->is_array())
    pipe.fail("balance", "expected a method (" + join(methods, ", ") + ") or a list of layer counts, got " + describe(*b));
  p.balance_method = BalanceMethod::List;
  for (const auto& e : *b) {
    // Read as the wider type first: 4294967297 must not become 1.
    const bool integer = e.is_number_integer() && !(e.is_number_unsigned() && e.get<uint64_t>() > INT64_MAX);
    if (!integer) pipe.fail("balance", "expected a list of integers, found " + describe(e));
    const int64_t layers = e.get<int64_t>();
    if (layers < 0 || layers > (1 << 30))
      pipe.fail("balance", detail::concat("a stage's layer count must be between 0 and ", 1 << 30, ", found ", describe(e)));
    p.balance.push_back(static_cast<int>(layers));
  }
}

void read_devices(JsonReader& pipe, PipelineConfig& p) {
  const json* d = pipe.get_raw("devices");
  if (!d) return;
  // "auto", "cpu", one device for every stage, or a list of one per stage (stages/device.h).
  if (d->is_string()) {
    p.devices = {d->get<std::string>()};
  } else if (d->is_array() && !d->empty()) {
    for (const auto& e : *d) {
      if (!e.is_string()) pipe.fail("devices", "expected device names (\"cpu\", \"cuda:0\"), found " + describe(e));
      p.devices.push_back(e.get<std::string>());
    }
  } else {
    pipe.fail("devices", "expected \"auto\", \"cpu\", a device name or a list of them (one per stage), found " + describe(*d));
  }
}

// pipeline.memory_limit and pipeline.speeds: one per stage (or one limit for all).
void read_limits(JsonReader& pipe, PipelineConfig& p) {
  if (const json* m = pipe.get_raw("memory_limit")) {
    auto bytes = [&](const json& v) {
      constexpr double kMax = 1152921504606846976.0;  // 2^60 bytes
      if (!v.is_number() || v.get<double>() < 0 || !(v.get<double>() <= kMax))
        pipe.fail("memory_limit", "expected bytes (a number from 0 to 2^60, 0 = no limit) or a list of them, found " +
                                      describe(v));
      return v.is_number_float() ? static_cast<int64_t>(v.get<double>()) : v.get<int64_t>();
    };
    if (m->is_array()) {
      for (const auto& e : *m) p.memory_limit.push_back(bytes(e));
      if (static_cast<int>(p.memory_limit.size()) != p.stages)
        pipe.fail("memory_limit", detail::concat("has ", p.memory_limit.size(), " entries but pipeline.stages is ", p.stages));
    } else {
      p.memory_limit.assign(p.stages, bytes(*m));
    }
  }
  p.speeds = pipe.get_numbers("speeds", {});
  if (p.speeds.empty()) return;
  if (static_cast<int>(p.speeds.size()) != p.stages)
    pipe.fail("speeds", detail::concat("has ", p.speeds.size(), " entries but pipeline.stages is ", p.stages));
  for (double v : p.speeds)
    if (!(v > 0) || !std::isfinite(v)) pipe.fail("speeds", detail::concat("every speed must be > 0, got ", v));
}

// The pipeline section; returns the stages' devices (resolved: they exist and this build runs them).
stages::StageDevices read_pipeline(JsonReader& top, const Config& c, PipelineConfig& p) {
  JsonReader pipe = top.child("pipeline");
  p.stages = static_cast<int>(pipe.get_int("stages", 1, 1, 4096));
  p.micro_batches = static_cast<int>(pipe.get_int("micro_batches", 1, 1, 1 << 20));
  p.schedule = schedule::parse_kind(pipe.get_choice("schedule", schedule::name(p.schedule), schedule::kind_names()));
  p.chunks = static_cast<int>(pipe.get_int("chunks", schedule::info(p.schedule).default_chunks, 1, 64));
  try {
    schedule::check_supported(p.schedule, p.stages, p.micro_batches, p.chunks);
  } catch (const ScheduleError& e) {
    pipe.fail("schedule", std::string(e.what()).substr(std::string("schedule: ").size()));
  }
  if (pipe.has("checkpoint"))
    pipe.fail("checkpoint", "renamed pipeline.recompute (the recomputation mode: always, except_last or never); "
                            "checkpoints of saved state are train.checkpoint_dir and train.checkpoint_every");
  p.recompute = parse_recompute(pipe.get_choice("recompute", recompute_name(p.recompute), recompute_modes()));
  if (const json* d = pipe.get_raw("defer_weight_grads")) {
    if (!d->is_boolean() && *d != "auto")
      pipe.fail("defer_weight_grads", "expected true, false or \"auto\", got " + describe(*d));
    p.defer_weight_grads = d->is_boolean() ? (d->get<bool>() ? DeferWeightGrads::On : DeferWeightGrads::Off)
                                           : DeferWeightGrads::Auto;
  }
  p.cuda_graphs = pipe.get_bool("cuda_graphs", p.cuda_graphs);
  read_balance(pipe, p);
  read_devices(pipe, p);
  stages::StageDevices devices = stages::resolve_devices(p.devices, p.stages, c.where("pipeline.devices"));
  read_limits(pipe, p);
  p.data_parallel = static_cast<int>(pipe.get_int("data_parallel", 1, 1, 4096));
  p.bucket_bytes = pipe.get_int("bucket_bytes", p.bucket_bytes, 1, int64_t(1) << 40);
  pipe.finish();
  const int64_t batch = c.data.batch_size;
  if (p.micro_batches > batch)
    pipe.fail("micro_batches", detail::concat(p.micro_batches, " micro-batches exceed data.batch_size ", batch,
                                              " (each micro-batch needs at least one sample)"));
  // Each copy's shard of a batch is cut into the micro-batches: the smallest shard needs one
  // sample per micro-batch.
  if (p.data_parallel > 1 && batch / p.data_parallel < p.micro_batches)
    pipe.fail("data_parallel", detail::concat(p.data_parallel, " copies split data.batch_size ", batch, " into shards of ",
                                              batch / p.data_parallel, " samples or more, fewer than the ",
                                              p.micro_batches, " micro-batches each is cut into"));
  return devices;
}

void read_optimizer(JsonReader& top, OptimizerConfig& o) {
  JsonReader opt = top.child("optimizer");
  o.kind = parse_optimizer(opt.get_choice("kind", optimizer_name(o.kind), optimizer_names()));
  o.lr = opt.get_number("lr", o.lr, 0.0, 1e6);
  o.momentum = opt.get_number("momentum", o.momentum, 0.0, 1.0);
  o.nesterov = opt.get_bool("nesterov", o.nesterov);
  o.weight_decay = opt.get_number("weight_decay", o.weight_decay, 0.0, 1e6);
  auto betas = opt.get_numbers("betas", {o.beta1, o.beta2});
  if (betas.size() != 2 || betas[0] < 0 || betas[0] >= 1 || betas[1] < 0 || betas[1] >= 1)
    opt.fail("betas", "expected two numbers in [0, 1)");
  o.beta1 = betas[0];
  o.beta2 = betas[1];
  o.eps = opt.get_number("eps", o.eps, 0.0, 1.0);
  o.lr_schedule = read_choice(opt, "lr_schedule", o.lr_schedule);
  o.warmup_steps = opt.get_int("warmup_steps", o.warmup_steps, 0, int64_t(1) << 40);
  o.min_lr = opt.get_number("min_lr", o.min_lr, 0.0, 1e6);
  o.grad_clip = opt.get_number("grad_clip", o.grad_clip, 0.0, 1e12);
  opt.finish();
}

void read_train(JsonReader& top, const Config& c, bool gpu_stages, TrainConfig& t) {
  JsonReader train = top.child("train");
  t.steps = train.get_int("steps", t.steps, 0, int64_t(1) << 40);
  t.seed = static_cast<uint64_t>(train.get_int("seed", 0, 0, INT64_MAX));
  t.log_every = train.get_int("log_every", t.log_every, 1, int64_t(1) << 40);
  t.eval_batches = train.get_int("eval_batches", t.eval_batches, 0, int64_t(1) << 40);
  t.accumulate = train.get_int("accumulate", t.accumulate, 1, 1 << 20);
  t.on_nonfinite = read_choice(train, "on_nonfinite", t.on_nonfinite);
  t.eval_every = train.get_int("eval_every", t.eval_every, 0, int64_t(1) << 40);
  t.checkpoint_every = train.get_int("checkpoint_every", t.checkpoint_every, 0, int64_t(1) << 40);
  t.checkpoint_dir = train.get_string("checkpoint_dir", t.checkpoint_dir);
  t.keep_checkpoints = train.get_int("keep_checkpoints", t.keep_checkpoints, 1, 1 << 20);
  t.shard_optimizer = train.get_bool("shard_optimizer", t.shard_optimizer);
  t.tensorboard = train.get_string("tensorboard", t.tensorboard);
  t.precision = parse_precision(train.get_choice("precision", precision_name(t.precision), precision_names()));
  if (t.precision == Precision::FP16 && !gpu_stages)
    train.fail("precision", "fp16 is for GPU stages only, and these stages run on the CPU; use bf16 there "
                            "(float32's range, no loss scaling needed)");
  train.finish();
}

// runtime.transport: a backend's name (comm/backend.h) or "auto", resolved here: nccl between
// GPUs, else ucx, else gloo for processes; local for threads. Checked against runtime.kind.
void read_transport(JsonReader& rt, bool gpu_stages, RuntimeConfig& r) {
  const bool processes = r.kind == RuntimeKind::Processes;
  const bool given = rt.has("transport");
  std::vector<std::string> names = comm::backend_names();
  names.emplace_back("auto");
  const std::string name = rt.get_choice("transport", processes ? "auto" : comm::name(r.transport), names);
  if (name != "auto") r.transport = comm::parse_backend(name);  // "auto" is the set's one word beyond the table
  else if (!processes) r.transport = comm::Backend::Local;
  else if (gpu_stages && comm::info(comm::Backend::Nccl).compiled) r.transport = comm::Backend::Nccl;
  else r.transport = comm::info(comm::Backend::Ucx).compiled ? comm::Backend::Ucx : comm::Backend::Gloo;
  const comm::BackendInfo& b = comm::info(r.transport);
  const std::string quoted = std::string("\"") + b.name + "\"";
  if (!b.compiled)
    rt.fail(given ? "transport" : "kind", quoted + " is not compiled into this build (needs " + b.needs + ")" +
                                              (given ? "" : "; runtime.kind processes talks over it"));
  if (processes && !b.processes) {
    std::vector<std::string> between;  // the compiled backends whose ranks may be processes
    for (const comm::BackendInfo& t : comm::backend_table())
      if (t.compiled && t.processes) between.push_back(std::string("\"") + t.name + "\"");
    rt.fail("transport", quoted + " connects the stage threads of one process (" + b.help +
                             "); runtime.kind processes needs one of " + join(between, ", "));
  }
  if (!processes && !b.threads)
    rt.fail("transport", quoted + " joins one process per GPU: use it with runtime.kind processes (the stage threads "
                                  "of one process talk over \"local\")");
  if (b.gpu_only && !gpu_stages)
    rt.fail("transport", quoted + " carries tensors between GPUs, and these stages run on the CPU (pipeline.devices); "
                                  "use \"gloo\" or \"ucx\"");
}

void read_runtime(JsonReader& top, bool gpu_stages, Precision precision, RuntimeConfig& r) {
  JsonReader rt = top.child("runtime");
  r.kind = read_choice(rt, "kind", r.kind);
  read_transport(rt, gpu_stages, r);
  r.detect_peer_failure = rt.get_bool("detect_peer_failure", r.detect_peer_failure);
  r.intra_op_threads = static_cast<int>(rt.get_int("intra_op_threads", 0, 0, 1024));
  r.timeout_s = rt.get_number("timeout_s", r.timeout_s, 0.001, 1e7);
  r.max_message_bytes = static_cast<uint64_t>(
      rt.get_int("max_message_bytes", static_cast<int64_t>(r.max_message_bytes), 1, INT64_MAX));
  r.dtype = read_choice(rt, "dtype", r.dtype);
  r.cudnn_benchmark = rt.get_bool("cudnn_benchmark", r.cudnn_benchmark);
  r.tf32 = rt.get_bool("tf32", r.tf32);
  r.deterministic = rt.get_bool("deterministic", r.deterministic);
  if (r.deterministic && r.cudnn_benchmark)
    rt.fail("cudnn_benchmark", "picks convolution algorithms by timing, which runtime.deterministic rules out");
  if (r.dtype != DType::Float32 && precision != Precision::FP32)
    rt.fail("dtype", std::string("train.precision ") + precision_name(precision) +
                         " computes in a reduced precision from float32 master weights; it needs runtime.dtype float32");
  rt.finish();
}

}  // namespace

Config parse_config(const json& input, const std::string& source, const std::vector<std::string>& overrides) {
  if (!input.is_object()) throw ConfigError(source + ": the config must be a JSON object");
  json root = input;
  auto origins = std::make_shared<Origins>();
  apply_overrides(root, overrides, *origins);

  Config c;
  c.source = source;
  c.origins = origins;
  c.root = root;
  JsonReader top(root, "", source, origins);

  if (const json* m = top.get_raw("model")) {
    if (!m->is_object()) top.fail("model", "expected an object, got " + describe(*m));
    c.model = *m;
  } else {
    top.fail("model", "is required (an object with at least \"family\")");
  }
  read_data(top, c.data);
  const bool gpu_stages = read_pipeline(top, c, c.pipeline).any_cuda();
  read_optimizer(top, c.optimizer);
  read_train(top, c, gpu_stages, c.train);
  read_runtime(top, gpu_stages, c.train.precision, c.runtime);
  top.finish();
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  // A directory reads as empty text and a device may never end: a regular file, or a pipe
  // (a shell's process substitution, <(...)).
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::is_directory(st)) throw ConfigError(path + ": is a directory, not a config file");
  if (!ec && !std::filesystem::is_regular_file(st) && !std::filesystem::is_fifo(st))
    throw ConfigError(path + ": not a regular file (a config is a JSON file)");
  if (!ec && std::filesystem::is_regular_file(st) && std::filesystem::file_size(path, ec) > (uint64_t(64) << 20) && !ec)
    throw ConfigError(path + ": over 64 MiB, too large for a config file");
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open the config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(parse_json(ss.str(), path), path, overrides);
}

double learning_rate(const OptimizerConfig& c, int64_t step, int64_t total) {
  if (c.warmup_steps > 0 && step < c.warmup_steps)
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  if (c.lr_schedule != LrSchedule::Cosine) return c.lr;
  const double span = static_cast<double>(std::max<int64_t>(1, total - c.warmup_steps));
  const double t = std::min(1.0, static_cast<double>(step - c.warmup_steps) / span);
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * t));
}

}  // namespace pipetrain::job
