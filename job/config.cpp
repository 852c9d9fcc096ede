#include "job/config.h"

#include "stages/device.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "comm/transport.h"
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

int intra_op_threads(const RuntimeConfig& runtime, int stages) {
  if (runtime.intra_op_threads > 0) return runtime.intra_op_threads;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, stages));
}

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

  JsonReader data = top.child("data");
  c.data.kind = data.get_choice("kind", c.data.kind, {"synthetic", "fashion-mnist", "text", "tensors", "tokens"});
  c.data.batch_size = data.get_int("batch_size", c.data.batch_size, 1, 1 << 24);
  const bool text = c.data.kind == "text", tensors = c.data.kind == "tensors", tokens = c.data.kind == "tokens";
  c.data.path = data.get_string("path", text || tensors || tokens ? "" : c.data.path);
  if (text && c.data.path.empty()) data.fail("path", "is required for data.kind text (the text file to train on)");
  if (tensors && c.data.path.empty())
    data.fail("path", "is required for data.kind tensors (a torch.save file of a dict of tensors, or a folder of .npy files)");
  if (tokens && c.data.path.empty())
    data.fail("path", "is required for data.kind tokens (a .npy or raw .bin file of token ids)");
  c.data.samples = data.get_int("samples", c.data.samples, 1, int64_t(1) << 32);
  c.data.test_samples = data.get_int("test_samples", c.data.test_samples, 0, int64_t(1) << 32);
  c.data.test_fraction = data.get_number("test_fraction", c.data.test_fraction, 0.0, 1.0);
  if (c.data.test_fraction <= 0.0 || c.data.test_fraction >= 1.0)
    data.fail("test_fraction", detail::concat("must be between 0 and 1 (exclusive), got ", c.data.test_fraction));
  c.data.stride = data.get_int("stride", c.data.stride, 0, int64_t(1) << 40);
  // Keys of data.kind tokens alone: elsewhere they would be silently unused.
  for (const char* key : {"test_path", "dtype"})
    if (!tokens && data.has(key)) data.fail(key, "is read by data.kind tokens only");
  c.data.test_path = data.get_string("test_path", "");
  if (tokens && data.has("test_path") && c.data.test_path.empty()) data.fail("test_path", "is empty (leave it out to test on data.test_fraction of data.path)");
  if (!c.data.test_path.empty() && data.has("test_fraction"))
    data.fail("test_fraction", "is not used with data.test_path (that file is the test split)");
  c.data.dtype = data.get_choice("dtype", "uint16", {"uint16", "uint32"});
  if (!data.has("dtype")) c.data.dtype.clear();  // a .npy says its own; a .bin defaults to uint16
  c.data.drop_last = data.get_bool("drop_last", c.data.drop_last);
  data.finish();

  JsonReader pipe = top.child("pipeline");
  c.pipeline.stages = static_cast<int>(pipe.get_int("stages", 1, 1, 4096));
  c.pipeline.micro_batches = static_cast<int>(pipe.get_int("micro_batches", 1, 1, 1 << 20));
  c.pipeline.schedule = schedule::parse_kind(
      pipe.get_choice("schedule", schedule::name(c.pipeline.schedule), schedule::kind_names()));
  c.pipeline.chunks = static_cast<int>(
      pipe.get_int("chunks", schedule::info(c.pipeline.schedule).default_chunks, 1, 64));
  try {
    schedule::check_supported(c.pipeline.schedule, c.pipeline.stages, c.pipeline.micro_batches,
                              c.pipeline.chunks);
  } catch (const ScheduleError& e) {
    pipe.fail("schedule", std::string(e.what()).substr(std::string("schedule: ").size()));
  }
  if (pipe.has("checkpoint"))
    pipe.fail("checkpoint", "renamed pipeline.recompute (the recomputation mode: always, except_last or never); "
                            "checkpoints of saved state are train.checkpoint_dir and train.checkpoint_every");
  c.pipeline.recompute =
      parse_recompute(pipe.get_choice("recompute", recompute_name(c.pipeline.recompute), recompute_modes()));
  if (const json* d = pipe.get_raw("defer_weight_grads")) {
    if (!d->is_boolean() && *d != "auto")
      pipe.fail("defer_weight_grads", "expected true, false or \"auto\", got " + describe(*d));
    c.pipeline.defer_weight_grads = d->is_boolean() ? (d->get<bool>() ? DeferWeightGrads::On : DeferWeightGrads::Off)
                                                    : DeferWeightGrads::Auto;
  }
  c.pipeline.cuda_graphs = pipe.get_bool("cuda_graphs", c.pipeline.cuda_graphs);
  if (const json* b = pipe.get_raw("balance")) {
    const std::vector<std::string> methods{"uniform", "parameters", "time", "memory"};
    if (b->is_string()) {
      c.pipeline.balance_method = b->get<std::string>();
      if (std::find(methods.begin(), methods.end(), c.pipeline.balance_method) == methods.end()) {
        std::string hint = nearest(c.pipeline.balance_method, methods);
        pipe.fail("balance", "unknown method \"" + c.pipeline.balance_method + "\"" +
                                 (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)") +
                                 "; use one of " + join(methods, ", ") + " or a list of layer counts");
      }
    } else if (b->is_array()) {
      c.pipeline.balance_method = "list";
      for (const auto& e : *b) {
        // Read as the wider type first: 4294967297 must not become 1.
        const bool integer = e.is_number_integer() && !(e.is_number_unsigned() && e.get<uint64_t>() > INT64_MAX);
        if (!integer) pipe.fail("balance", "expected a list of integers, found " + describe(e));
        const int64_t layers = e.get<int64_t>();
        if (layers < 0 || layers > (1 << 30))
          pipe.fail("balance", detail::concat("a stage's layer count must be between 0 and ", 1 << 30, ", found ",
                                              describe(e)));
        c.pipeline.balance.push_back(static_cast<int>(layers));
      }
    } else {
      pipe.fail("balance", "expected a method (uniform, parameters, time, memory) or a list of layer counts, got " +
                               describe(*b));
    }
  }
  if (const json* d = pipe.get_raw("devices")) {
    // "auto", "cpu", one device for every stage, or a list of one per stage (stages/device.h).
    if (d->is_string()) {
      c.pipeline.devices = {d->get<std::string>()};
    } else if (d->is_array() && !d->empty()) {
      for (const auto& e : *d) {
        if (!e.is_string()) pipe.fail("devices", "expected device names (\"cpu\", \"cuda:0\"), found " + describe(e));
        c.pipeline.devices.push_back(e.get<std::string>());
      }
    } else {
      pipe.fail("devices", "expected \"auto\", \"cpu\", a device name or a list of them (one per stage), found " + describe(*d));
    }
  }
  // The names, their count, and that each device exists here and this build can run it.
  const stages::StageDevices devices =
      stages::resolve_devices(c.pipeline.devices, c.pipeline.stages, c.where("pipeline.devices"));
  if (const json* m = pipe.get_raw("memory_limit")) {
    auto bytes = [&](const json& v) {
      constexpr double kMax = 1152921504606846976.0;  // 2^60 bytes
      if (!v.is_number() || v.get<double>() < 0 || !(v.get<double>() <= kMax))
        pipe.fail("memory_limit", "expected bytes (a number from 0 to 2^60, 0 = no limit) or a list of them, found " +
                                      describe(v));
      return v.is_number_float() ? static_cast<int64_t>(v.get<double>()) : v.get<int64_t>();
    };
    if (m->is_array()) {
      for (const auto& e : *m) c.pipeline.memory_limit.push_back(bytes(e));
      if (static_cast<int>(c.pipeline.memory_limit.size()) != c.pipeline.stages)
        pipe.fail("memory_limit", detail::concat("has ", c.pipeline.memory_limit.size(), " entries but pipeline.stages is ",
                                                 c.pipeline.stages));
    } else {
      c.pipeline.memory_limit.assign(c.pipeline.stages, bytes(*m));
    }
  }
  c.pipeline.speeds = pipe.get_numbers("speeds", {});
  if (!c.pipeline.speeds.empty()) {
    if (static_cast<int>(c.pipeline.speeds.size()) != c.pipeline.stages)
      pipe.fail("speeds", detail::concat("has ", c.pipeline.speeds.size(), " entries but pipeline.stages is ",
                                         c.pipeline.stages));
    for (double v : c.pipeline.speeds)
      if (!(v > 0) || !std::isfinite(v)) pipe.fail("speeds", detail::concat("every speed must be > 0, got ", v));
  }
  c.pipeline.data_parallel = static_cast<int>(pipe.get_int("data_parallel", 1, 1, 4096));
  c.pipeline.bucket_bytes = pipe.get_int("bucket_bytes", c.pipeline.bucket_bytes, 1, int64_t(1) << 40);
  pipe.finish();
  if (c.pipeline.micro_batches > c.data.batch_size)
    pipe.fail("micro_batches", detail::concat(c.pipeline.micro_batches,
                                              " micro-batches exceed data.batch_size ", c.data.batch_size,
                                              " (each micro-batch needs at least one sample)"));
  // Each copy's shard of a batch is cut into the micro-batches: the smallest shard needs one
  // sample per micro-batch.
  if (c.pipeline.data_parallel > 1 && c.data.batch_size / c.pipeline.data_parallel < c.pipeline.micro_batches)
    pipe.fail("data_parallel", detail::concat(c.pipeline.data_parallel, " copies split data.batch_size ", c.data.batch_size,
                                              " into shards of ", c.data.batch_size / c.pipeline.data_parallel,
                                              " samples or more, fewer than the ", c.pipeline.micro_batches,
                                              " micro-batches each is cut into"));

  JsonReader opt = top.child("optimizer");
  c.optimizer.kind = parse_optimizer(
      opt.get_choice("kind", optimizer_name(c.optimizer.kind), optimizer_names()));
  c.optimizer.lr = opt.get_number("lr", c.optimizer.lr, 0.0, 1e6);
  c.optimizer.momentum = opt.get_number("momentum", c.optimizer.momentum, 0.0, 1.0);
  c.optimizer.nesterov = opt.get_bool("nesterov", c.optimizer.nesterov);
  c.optimizer.weight_decay = opt.get_number("weight_decay", c.optimizer.weight_decay, 0.0, 1e6);
  auto betas = opt.get_numbers("betas", {c.optimizer.beta1, c.optimizer.beta2});
  if (betas.size() != 2 || betas[0] < 0 || betas[0] >= 1 || betas[1] < 0 || betas[1] >= 1)
    opt.fail("betas", "expected two numbers in [0, 1)");
  c.optimizer.beta1 = betas[0];
  c.optimizer.beta2 = betas[1];
  c.optimizer.eps = opt.get_number("eps", c.optimizer.eps, 0.0, 1.0);
  c.optimizer.lr_schedule = opt.get_choice("lr_schedule", c.optimizer.lr_schedule, {"constant", "cosine"});
  c.optimizer.warmup_steps = opt.get_int("warmup_steps", c.optimizer.warmup_steps, 0, int64_t(1) << 40);
  c.optimizer.min_lr = opt.get_number("min_lr", c.optimizer.min_lr, 0.0, 1e6);
  c.optimizer.grad_clip = opt.get_number("grad_clip", c.optimizer.grad_clip, 0.0, 1e12);
  opt.finish();

  JsonReader train = top.child("train");
  c.train.steps = train.get_int("steps", c.train.steps, 0, int64_t(1) << 40);
  c.train.seed = static_cast<uint64_t>(train.get_int("seed", 0, 0, INT64_MAX));
  c.train.log_every = train.get_int("log_every", c.train.log_every, 1, int64_t(1) << 40);
  c.train.eval_batches = train.get_int("eval_batches", c.train.eval_batches, 0, int64_t(1) << 40);
  c.train.accumulate = train.get_int("accumulate", c.train.accumulate, 1, 1 << 20);
  c.train.on_nonfinite = train.get_choice("on_nonfinite", c.train.on_nonfinite, {"stop", "skip"});
  c.train.eval_every = train.get_int("eval_every", c.train.eval_every, 0, int64_t(1) << 40);
  c.train.checkpoint_every = train.get_int("checkpoint_every", c.train.checkpoint_every, 0, int64_t(1) << 40);
  c.train.checkpoint_dir = train.get_string("checkpoint_dir", c.train.checkpoint_dir);
  c.train.keep_checkpoints = train.get_int("keep_checkpoints", c.train.keep_checkpoints, 1, 1 << 20);
  c.train.shard_optimizer = train.get_bool("shard_optimizer", c.train.shard_optimizer);
  c.train.tensorboard = train.get_string("tensorboard", c.train.tensorboard);
  if (c.train.shard_optimizer && c.pipeline.data_parallel > 1 && c.model.is_object() &&
      c.model.contains("tie_embeddings") && c.model["tie_embeddings"].is_boolean() && c.model["tie_embeddings"].get<bool>())
    train.fail("shard_optimizer", "does not take tied parameters (model.tie_embeddings): a tie's gradients are summed "
                                  "over whole tensors, which sharding splits");
  c.train.precision = parse_precision(train.get_choice("precision", precision_name(c.train.precision), precision_names()));
  const bool gpu_stages = devices.any_cuda();
  if (c.train.precision == Precision::FP16 && !gpu_stages)
    train.fail("precision", "fp16 is for GPU stages only, and these stages run on the CPU; use bf16 there "
                            "(float32's range, no loss scaling needed)");
  train.finish();

  JsonReader rt = top.child("runtime");
  c.runtime.kind = rt.get_choice("kind", c.runtime.kind, {"threads", "processes"});
  const bool processes = c.runtime.kind == "processes";
  const bool transport_given = rt.has("transport");
  c.runtime.transport = rt.get_choice("transport", processes ? "auto" : c.runtime.transport,
                                      {"local", "ucx", "gloo", "nccl", "nccl-order", "auto"});
  // auto: NCCL between GPUs, else UCX, else Gloo; the threads of one process share mailboxes.
  if (c.runtime.transport == "auto")
    c.runtime.transport = !processes                                                     ? "local"
                          : gpu_stages && comm::has_transport_backend("nccl")            ? "nccl"
                          : comm::has_transport_backend("ucx")                           ? "ucx"
                                                                                         : "gloo";
  if (!comm::has_transport_backend(c.runtime.transport))
    rt.fail(transport_given ? "transport" : "kind",
            "\"" + c.runtime.transport + "\" is not compiled into this build (needs " +
                (c.runtime.transport == "nccl" ? "a libtorch with CUDA and NCCL" : "UCX") + " at configure time)" +
                (transport_given ? "" : "; runtime.kind processes talks over it"));
  if (processes && c.runtime.transport == "nccl-order")
    rt.fail("transport", "\"nccl-order\" (NCCL's ordering on the CPU, for tests) connects the stage threads of one "
                         "process; runtime.kind processes needs \"ucx\", \"gloo\" or \"nccl\"");
  if (processes && c.runtime.transport == "local")
    rt.fail("transport", "\"local\" connects the stage threads of one process; runtime.kind processes needs \"ucx\", "
                         "\"gloo\" or \"nccl\"");
  if (c.runtime.transport == "nccl" && !processes)
    rt.fail("transport", "\"nccl\" joins one process per GPU: use it with runtime.kind processes (the stage threads "
                         "of one process talk over \"local\")");
  if (c.runtime.transport == "nccl" && !gpu_stages)
    rt.fail("transport", "\"nccl\" carries tensors between GPUs, and these stages run on the CPU (pipeline.devices); "
                         "use \"gloo\" or \"ucx\"");
  c.runtime.detect_peer_failure = rt.get_bool("detect_peer_failure", c.runtime.detect_peer_failure);
  c.runtime.intra_op_threads = static_cast<int>(rt.get_int("intra_op_threads", 0, 0, 1024));
  c.runtime.timeout_s = rt.get_number("timeout_s", c.runtime.timeout_s, 0.001, 1e7);
  c.runtime.max_message_bytes = static_cast<uint64_t>(
      rt.get_int("max_message_bytes", static_cast<int64_t>(c.runtime.max_message_bytes), 1, INT64_MAX));
  c.runtime.dtype = rt.get_choice("dtype", c.runtime.dtype, {"float32", "float64"});
  c.runtime.cudnn_benchmark = rt.get_bool("cudnn_benchmark", c.runtime.cudnn_benchmark);
  c.runtime.tf32 = rt.get_bool("tf32", c.runtime.tf32);
  c.runtime.deterministic = rt.get_bool("deterministic", c.runtime.deterministic);
  if (c.runtime.deterministic && c.runtime.cudnn_benchmark)
    rt.fail("cudnn_benchmark", "picks convolution algorithms by timing, which runtime.deterministic rules out");
  if (c.runtime.dtype != "float32" && c.train.precision != Precision::FP32)
    rt.fail("dtype", std::string("train.precision ") + precision_name(c.train.precision) +
                         " computes in a reduced precision from float32 master weights; it needs runtime.dtype float32");
  rt.finish();

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
  if (c.lr_schedule != "cosine") return c.lr;
  const double span = static_cast<double>(std::max<int64_t>(1, total - c.warmup_steps));
  const double t = std::min(1.0, static_cast<double>(step - c.warmup_steps) / span);
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * t));
}

}  // namespace pipetrain::job
