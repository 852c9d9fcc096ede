#include <gtest/gtest.h>

#include <torch/torch.h>

#include <set>

#include "comm/transport.h"
#include "common/config.h"
#include "common/error.h"
#include "common/option.h"
#include "common/strings.h"
#include "job/config.h"
#include "job/balance.h"
#include "job/runtime.h"
#include "checkpoint/checkpoint.h"
#include "train/trainer.h"
#include "stages/accelerator.h"
#include "stages/device.h"
#include "tests/helpers.h"

using namespace pipetrain;
using namespace pipetrain::pipeline;
using namespace pipetrain::job;
using namespace pipetrain::train;
using nlohmann::json;

namespace {
json base() {
  return json{{"model", {{"family", "mlp"}, {"in", 8}, {"width", 8}, {"layers", 3}, {"out", 4}}},
              {"data", {{"kind", "synthetic"}, {"batch_size", 8}, {"samples", 64}, {"test_samples", 16}}},
              {"pipeline", {{"stages", 2}, {"micro_batches", 2}}}};
}

// A message with its run options spelled by their plain names (the command spells them as its
// flags, apps/option_flags.cpp: --set for "override"; cli_test checks those).
std::string plain(const std::string& message) {
  return render_options(message, [](Option o) { return std::string(option_name(o)); });
}

// The message of the ConfigError that parsing (and preparing) `cfg` raises, or "" if none.
std::string error_of(const json& cfg, const std::vector<std::string>& overrides = {}) {
  try {
    Config c = parse_config(cfg, "cfg.json", overrides);
    prepare_balanced(c);
  } catch (const ConfigError& e) {
    return plain(e.what());
  } catch (const DataError& e) {
    return plain(e.what());
  }
  return "";
}

#define EXPECT_ERROR(cfg_or_call, needle)                                           \
  do {                                                                              \
    const std::string msg = (cfg_or_call);                                          \
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: '" << msg << "'";  \
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line expected: " << msg;  \
  } while (0)
}  // namespace

TEST(Config, ValidConfigParses) {
  EXPECT_EQ(error_of(base()), "");
  Config c = parse_config(base(), "cfg.json");
  EXPECT_EQ(c.pipeline.stages, 2);
  EXPECT_EQ(c.pipeline.recompute, pipetrain::Recompute::ExceptLast);
  EXPECT_EQ(c.runtime.intra_op_threads, 0);
  EXPECT_GE(intra_op_threads(c.runtime, 2), 1);
}

TEST(Config, UnknownKeysNameTheNearestValidKey) {
  json c = base();
  c["pipeline"]["micro_batchs"] = 2;
  EXPECT_ERROR(error_of(c), "cfg.json: pipeline.micro_batchs: unknown key (did you mean 'pipeline.micro_batches'?)");
  c = base();
  c["trian"] = json::object();
  EXPECT_ERROR(error_of(c), "did you mean 'train'");
  c = base();
  c["model"]["widht"] = 3;
  EXPECT_ERROR(error_of(c), "cfg.json: model.widht: unknown key (did you mean 'model.width'?)");
}

// pipeline.devices: "auto", "cpu", one name for all, or one per stage; a device that does not
// exist, a kind the stages cannot run and a CUDA device where there is none are one line each.
TEST(Config, PipelineDevices) {
  auto with = [](const json& d) {
    json c = base();
    c["pipeline"]["devices"] = d;
    return error_of(c);
  };
  EXPECT_EQ(with("cpu"), "");
  EXPECT_EQ(with("auto"), "");
  EXPECT_EQ(with(json::array({"cpu", "cpu"})), "");
  EXPECT_ERROR(with("tpu:0"), "cfg.json: pipeline.devices: unknown device \"tpu:0\"; stages run on \"cpu\" or \"cuda\"");
  EXPECT_ERROR(with("mps"), "pipeline.devices: unknown device \"mps\"");
  EXPECT_ERROR(with(json::array({"cpu", "tpu:0"})), "cfg.json: pipeline.devices[1]: unknown device \"tpu:0\"");
  EXPECT_ERROR(with(json::array({"cpu", "cpu", "cpu"})), "pipeline.devices: 3 devices for 2 stages");
  EXPECT_ERROR(with(json::array({"auto", "cpu"})), "pipeline.devices[0]: \"auto\" stands alone");
  EXPECT_ERROR(with(7), "pipeline.devices: expected \"auto\", \"cpu\", a device name or a list of them");
  EXPECT_ERROR(with(json::array({"cpu", 3})), "pipeline.devices: expected device names");
  const int gpus = stages::accelerator_info().gpus;
  EXPECT_ERROR(with(pipetrain::detail::concat("cuda:", gpus)), pipetrain::detail::concat("\"cuda:", gpus, "\" does not exist: this process sees"));
  if (gpus == 0) {
    EXPECT_ERROR(with("cuda"), "pipeline.devices: \"cuda\" does not exist: this process sees no CUDA device");
    // fp16 is refused on the CPU, here where "auto" means the CPU.
    json c = base();
    c["train"]["precision"] = "fp16";
    EXPECT_ERROR(error_of(c), "fp16 is for GPU stages only");
    // "auto" trains on the CPU.
    c = base();
    c["pipeline"]["devices"] = "auto";
    const Job job = prepare_balanced(parse_config(c, "cfg.json"));
    ASSERT_EQ(job.options.devices.size(), 2u);
    for (const auto& d : job.options.devices) EXPECT_TRUE(d.is_cpu());
    EXPECT_NE(job.devices.note.find("pipeline.devices auto: the CPU"), std::string::npos) << job.devices.note;
  }
}

// pipeline.devices is decided in one place (stages::resolve_devices), checked here against a
// report of four GPUs and one of none: "auto" puts stage s on cuda:(s mod 4), and a rank of a
// multi-process job (its place among its host's ranks given) every stage on that place's GPU;
// names are taken as written; the note is worth saying when "auto" was asked for or chose GPUs.
TEST(Config, DevicesAreDecidedInOnePlace) {
  using c10::Device;
  const auto cuda = [](int i) { return Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)); };
  const Device cpu(c10::kCPU);
  stages::AcceleratorInfo four, none;
  four.cuda = none.cuda = true;
  four.gpus = 4;
  none.no_gpu_reason = "no CUDA-capable device is detected";
  stages::StageDevices d = stages::resolve_devices({}, 6, "p", -1, four);
  EXPECT_EQ(d.per_stage, (std::vector<Device>{cuda(0), cuda(1), cuda(2), cuda(3), cuda(0), cuda(1)}));
  EXPECT_TRUE(d.chosen && !d.asked_auto && d.worth_noting() && d.any_cuda() && !d.any_cpu());
  EXPECT_EQ(d.note, "pipeline.devices auto: 6 stages on 4 of 4 GPUs");
  d = stages::resolve_devices({"auto"}, 2, "p", 5, four);
  EXPECT_EQ(d.per_stage, (std::vector<Device>{cuda(1), cuda(1)}));
  EXPECT_EQ(d.note, "pipeline.devices auto: this rank's stages on cuda:1 of 4 GPUs (its place among its host's ranks)");
  d = stages::resolve_devices({}, 2, "p", 5, none);
  EXPECT_EQ(d.per_stage, (std::vector<Device>{cpu, cpu}));
  EXPECT_FALSE(d.worth_noting());  // left out, and the CPU: nothing to say
  EXPECT_EQ(d.note, "pipeline.devices auto: the CPU (no CUDA-capable device is detected)");
  EXPECT_TRUE(stages::resolve_devices({"auto"}, 2, "p", -1, none).worth_noting());
  d = stages::resolve_devices({"cuda:3", "cpu"}, 2, "p", 0, four);
  EXPECT_EQ(d.per_stage, (std::vector<Device>{cuda(3), cpu}));
  EXPECT_TRUE(!d.chosen && d.note.empty() && !d.worth_noting() && d.any_cuda() && d.any_cpu());
  EXPECT_EQ(stages::resolve_devices({"cuda"}, 3, "p", 2, four).per_stage, (std::vector<Device>(3, cuda(0))));
  std::string refused;
  try {
    stages::resolve_devices({"cpu", "cuda:4"}, 2, "p", -1, four);
  } catch (const ConfigError& e) {
    refused = e.what();
  }
  EXPECT_ERROR(refused, "p[1]: \"cuda:4\" does not exist: this process sees 4 CUDA devices (cuda:0 to cuda:3)");
  // A job's pipeline options are that decision.
  const Job job = prepare_balanced(parse_config(base(), "cfg.json"));
  EXPECT_EQ(job.options.devices, job.devices.per_stage);
  EXPECT_EQ(job.devices.per_stage.size(), 2u);
}

// pipeline.defer_weight_grads: "auto" by default (decided for the job: planner/deferral.h),
// true or false forcing it, each handed to the pipeline's options as prepare() knows it ("auto"
// off until decided); anything else a one-line error naming the key and the accepted values.
TEST(Config, DeferWeightGrads) {
  json c = base();
  EXPECT_EQ(parse_config(c, "cfg.json").pipeline.defer_weight_grads, DeferWeightGrads::Auto);
  EXPECT_FALSE(prepare(parse_config(c, "cfg.json")).options.defer_weight_grads);
  c["pipeline"]["defer_weight_grads"] = true;
  EXPECT_EQ(parse_config(c, "cfg.json").pipeline.defer_weight_grads, DeferWeightGrads::On);
  EXPECT_TRUE(prepare(parse_config(c, "cfg.json")).options.defer_weight_grads);
  c["pipeline"]["defer_weight_grads"] = false;
  EXPECT_EQ(parse_config(c, "cfg.json").pipeline.defer_weight_grads, DeferWeightGrads::Off);
  c["pipeline"]["defer_weight_grads"] = "auto";
  EXPECT_EQ(parse_config(c, "cfg.json").pipeline.defer_weight_grads, DeferWeightGrads::Auto);
  c["pipeline"]["defer_weight_grads"] = "yes";
  EXPECT_ERROR(error_of(c), "cfg.json: pipeline.defer_weight_grads: expected true, false or \"auto\", got string \"yes\"");
  c["pipeline"]["defer_weight_grads"] = 1;
  EXPECT_ERROR(error_of(c), "cfg.json: pipeline.defer_weight_grads: expected true, false or \"auto\", got number 1");
  // An override says where it came from, as every key's error does.
  EXPECT_ERROR(error_of(base(), {"pipeline.defer_weight_grads=sometimes"}),
               "override pipeline.defer_weight_grads=sometimes: pipeline.defer_weight_grads: expected true, false or \"auto\"");
  EXPECT_EQ(parse_config(base(), "cfg.json", {"pipeline.defer_weight_grads=auto"}).pipeline.defer_weight_grads,
            DeferWeightGrads::Auto);
}

// runtime.cudnn_benchmark, runtime.tf32 and runtime.deterministic: booleans, and benchmark-picked
// algorithms are not deterministic; make_pipeline hands them to libtorch.
TEST(Config, KernelSwitches) {
  json c = base();
  c["runtime"] = {{"tf32", true}, {"deterministic", true}};
  const Config parsed = parse_config(c, "cfg.json");
  EXPECT_TRUE(parsed.runtime.tf32);
  EXPECT_TRUE(parsed.runtime.deterministic);
  EXPECT_FALSE(parsed.runtime.cudnn_benchmark);
  c["runtime"]["cudnn_benchmark"] = true;
  EXPECT_ERROR(error_of(c), "cfg.json: runtime.cudnn_benchmark: picks convolution algorithms by timing");
  c["runtime"] = {{"tf32", "yes"}};
  EXPECT_ERROR(error_of(c), "runtime.tf32");
  apply_kernel_switches(parsed.runtime);
  EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
  EXPECT_TRUE(at::globalContext().allowTF32CuBLAS());
  apply_kernel_switches(RuntimeConfig{});
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
  EXPECT_FALSE(at::globalContext().allowTF32CuBLAS());
}

TEST(Config, RecomputeModes) {
  json c = base();
  c["pipeline"]["recompute"] = "never";
  EXPECT_EQ(parse_config(c, "cfg.json").pipeline.recompute, pipetrain::Recompute::Never);
  c["pipeline"]["recompute"] = "sometimes";
  EXPECT_ERROR(error_of(c), "cfg.json: pipeline.recompute: unknown value \"sometimes\"; choose one of: always, except_last, never");
  // The key's former name says where it went, in the file and on the command line.
  c = base();
  c["pipeline"]["checkpoint"] = "always";
  EXPECT_ERROR(error_of(c), "cfg.json: pipeline.checkpoint: renamed pipeline.recompute");
  EXPECT_ERROR(error_of(base(), {"pipeline.checkpoint=never"}), "override pipeline.checkpoint=never: pipeline.checkpoint: renamed");
}

TEST(Config, WrongTypes) {
  json c = base();
  c["pipeline"]["stages"] = "two";
  EXPECT_ERROR(error_of(c), "cfg.json: pipeline.stages: expected an integer, got string \"two\"");
  c = base();
  c["data"] = 5;
  EXPECT_ERROR(error_of(c), "cfg.json: data: expected an object");
  c = base();
  c["optimizer"] = {{"lr", "fast"}};
  EXPECT_ERROR(error_of(c), "optimizer.lr: expected a number");
}

TEST(Config, StagesBalanceAndMicroBatches) {
  json c = base();
  c["pipeline"]["stages"] = 5;
  EXPECT_ERROR(error_of(c), "pipeline.stages: 5 stages but the model has only 4 layers (fc1, fc2, fc3, head)");
  c = base();
  c["pipeline"]["balance"] = {1, 2};
  EXPECT_ERROR(error_of(c), "balance [1, 2] sums to 3 but the model has 4 layers");
  c = base();
  c["pipeline"]["balance"] = {4};
  EXPECT_ERROR(error_of(c), "has 1 entries but pipeline.stages is 2");
  c = base();
  c["pipeline"]["balance"] = {0, 4};
  EXPECT_ERROR(error_of(c), "no layers");
  c = base();
  c["pipeline"]["balance"] = "fastest";
  EXPECT_ERROR(error_of(c), "pipeline.balance: unknown method");
  c = base();
  c["pipeline"]["micro_batches"] = 0;
  EXPECT_ERROR(error_of(c), "cfg.json: pipeline.micro_batches: must be between 1");
  c = base();
  c["pipeline"]["micro_batches"] = 9;
  EXPECT_ERROR(error_of(c), "pipeline.micro_batches: 9 micro-batches exceed data.batch_size 8");
  c = base();
  c["pipeline"]["balance"] = {1, 3};
  EXPECT_EQ(error_of(c), "");
}

TEST(Config, Schedules) {
  json c = base();
  c["pipeline"]["schedule"] = "pipedream";
  EXPECT_ERROR(error_of(c), "pipeline.schedule: unknown value \"pipedream\"; choose one of: gpipe, 1f1b, interleaved-1f1b, zb-h1");
  c = base();
  c["pipeline"]["schedule"] = "interleaved-1f1b";
  c["pipeline"]["micro_batches"] = 3;
  EXPECT_ERROR(error_of(c), "pipeline.schedule: interleaved-1f1b sends micro-batches in groups of the stage count (2), so micro_batches must be a multiple of 2; got 3, try 2 or 4");
  c["pipeline"]["micro_batches"] = 4;
  c["pipeline"]["chunks"] = 3;
  EXPECT_ERROR(error_of(c), "pipeline.stages: 2 stages x 3 chunks (6 virtual stages) but the model has only 4 layers");
  c["model"]["layers"] = 5;
  EXPECT_EQ(error_of(c), "");
  c = base();
  c["pipeline"]["schedule"] = "1f1b";
  c["pipeline"]["chunks"] = 2;
  EXPECT_ERROR(error_of(c), "1f1b runs one chunk per stage, got chunks = 2 (use interleaved-1f1b or looped-bfs for virtual stages)");
  for (const char* kind : {"1f1b", "zb-h1"}) {
    c = base();
    c["pipeline"]["schedule"] = kind;
    EXPECT_EQ(error_of(c), "") << kind;
  }
}

TEST(Config, MissingDataFilesNameThePackage) {
  json c = base();
  c["model"] = {{"family", "cnn"}};
  c["data"] = {{"kind", "fashion-mnist"}, {"path", "/nonexistent/fmnist"}, {"batch_size", 8}};
  EXPECT_ERROR(error_of(c), "/nonexistent/fmnist/train-images-idx3-ubyte.gz not found (install the Debian package dataset-fashion-mnist");
}

TEST(Config, DataMustFitTheModel) {
  json c = base();
  c["data"] = {{"kind", "fashion-mnist"}, {"batch_size", 8}};  // 784 features, model takes 8
  EXPECT_ERROR(error_of(c), "data.kind: data set fashion-mnist gives samples of shape [1, 28, 28]");
}

TEST(Overrides, SetAnyKey) {
  Config c = parse_config(base(), "cfg.json",
                          {"pipeline.stages=1", "pipeline.recompute=never", "train.seed=9", "data.kind=synthetic",
                           "runtime.intra_op_threads=3", "model.width=16", "pipeline.balance=[4]"});
  EXPECT_EQ(c.pipeline.stages, 1);
  EXPECT_EQ(c.pipeline.recompute, pipetrain::Recompute::Never);
  EXPECT_EQ(c.train.seed, 9u);
  EXPECT_EQ(c.runtime.intra_op_threads, 3);
  EXPECT_EQ(c.model["width"], 16);
  EXPECT_EQ(c.pipeline.balance, (std::vector<int>{4}));
}

TEST(Overrides, ErrorsPointAtTheFlag) {
  EXPECT_ERROR(error_of(base(), {"pipeline.stagse=4"}),
               "override pipeline.stagse=4: pipeline.stagse: unknown key (did you mean 'pipeline.stages'?)");
  EXPECT_ERROR(error_of(base(), {"pipeline.stages=x"}), "override pipeline.stages=x: pipeline.stages: expected an integer");
  EXPECT_ERROR(error_of(base(), {"novalue"}), "override novalue: expected key.path=value");
  EXPECT_ERROR(error_of(base(), {"pipeline.stages.x=1"}), "pipeline.stages is not an object");
  EXPECT_ERROR(error_of(base(), {"model.dropout=2"}), "override model.dropout=2: model.dropout: must be between");
  // The run layer knows no flags: its message names the override by id (common/option.h), which
  // the caller spells (the command line: --set; here its plain name).
  try {
    parse_config(base(), "cfg.json", {"pipeline.stages=x"});
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos) << e.what();
    const std::string plain = render_options(e.what(), [](Option o) { return std::string(option_name(o)); });
    EXPECT_EQ(plain.rfind("override pipeline.stages=x: pipeline.stages: expected an integer", 0), 0u) << plain;
  }
}

TEST(Config, FilesAndSyntax) {
  try {
    load_config("/nonexistent/config.json");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "/nonexistent/config.json: cannot open the config file");
  }
  EXPECT_ERROR(error_of(json::array()), "the config must be a JSON object");
  json c = base();
  c.erase("model");
  EXPECT_ERROR(error_of(c), "cfg.json: model: is required");
}

TEST(Prepare, SameSeedSameInitialWeightsWhateverTheStageCount) {
  Job one = prepare_balanced(parse_config(base(), "cfg.json", {"pipeline.stages=1"}));
  Job four = prepare_balanced(parse_config(base(), "cfg.json", {"pipeline.stages=4", "pipeline.micro_batches=4"}));
  Job other_seed = prepare_balanced(parse_config(base(), "cfg.json", {"train.seed=1"}));
  EXPECT_TRUE(test::same_parameters(*one.model.layers, *four.model.layers));
  EXPECT_FALSE(test::same_parameters(*one.model.layers, *other_seed.model.layers));
  EXPECT_EQ(four.options.stages, 4);
  EXPECT_EQ(four.options.recompute, Recompute::ExceptLast);
}

TEST(Config, BalanceMethods) {
  for (const char* method : {"uniform", "parameters", "time", "memory"}) {
    json c = base();
    c["pipeline"]["balance"] = method;
    Config cfg = parse_config(c, "cfg.json");
    Job job = prepare_balanced(cfg);
    ASSERT_EQ(job.options.balance.size(), 2u) << method;
    EXPECT_EQ(job.options.balance[0] + job.options.balance[1], 4) << method;
  }
  // parameters: fc1..fc3 have 8x8+8 parameters, the head 8x4+4; the exact split is [2, 2].
  json c = base();
  c["pipeline"]["balance"] = "parameters";
  EXPECT_EQ(prepare_balanced(parse_config(c, "cfg.json")).options.balance, (std::vector<int>{2, 2}));
  c["pipeline"]["balance"] = "tme";
  EXPECT_ERROR(error_of(c), "pipeline.balance: unknown method \"tme\" (did you mean \"time\"?)");
  c = base();
  c["pipeline"]["balance"] = "time";
  c["pipeline"]["memory_limit"] = 100;
  EXPECT_ERROR(error_of(c), "pipeline.balance: partition: layer 0 'fc1' alone needs");
  c["pipeline"]["memory_limit"] = {100};
  EXPECT_ERROR(error_of(c), "pipeline.memory_limit: has 1 entries but pipeline.stages is 2");
  c["pipeline"]["memory_limit"] = "lots";
  EXPECT_ERROR(error_of(c), "pipeline.memory_limit: expected bytes");
  c = base();
  c["pipeline"]["speeds"] = {1};
  EXPECT_ERROR(error_of(c), "pipeline.speeds: has 1 entries but pipeline.stages is 2");
  c["pipeline"]["speeds"] = {1, 0};
  EXPECT_ERROR(error_of(c), "pipeline.speeds: every speed must be > 0, got 0");
  // A device three times as fast takes more of the work.
  c = base();
  c["model"]["layers"] = 7;
  c["pipeline"]["balance"] = "time";
  c["pipeline"]["speeds"] = {1, 3};
  auto b = prepare_balanced(parse_config(c, "cfg.json")).options.balance;
  EXPECT_GT(b[1], b[0]) << b[0] << "," << b[1];
}

TEST(Config, LearningRateSchedules) {
  OptimizerConfig o;
  o.lr = 1.0;
  EXPECT_DOUBLE_EQ(learning_rate(o, 0, 100), 1.0);
  o.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(learning_rate(o, 0, 100), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(o, 3, 100), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(o, 50, 100), 1.0);
  o.lr_schedule = LrSchedule::Cosine;
  o.min_lr = 0.1;
  EXPECT_DOUBLE_EQ(learning_rate(o, 4, 104), 1.0);                     // the decay starts at lr
  EXPECT_NEAR(learning_rate(o, 54, 104), 0.1 + 0.45, 1e-12);          // halfway: the mean of lr and min_lr
  EXPECT_NEAR(learning_rate(o, 104, 104), 0.1, 1e-12);                // the end: min_lr
  EXPECT_NEAR(learning_rate(o, 500, 104), 0.1, 1e-12);                // and stays there
  json c = base();
  c["optimizer"] = {{"lr_schedule", "linear"}};
  EXPECT_ERROR(error_of(c), "optimizer.lr_schedule: unknown value \"linear\"");
  c["optimizer"] = {{"grad_clip", -1}};
  EXPECT_ERROR(error_of(c), "optimizer.grad_clip: must be between 0");
  c["optimizer"] = json::object();
  c["train"] = {{"accumulate", 0}};
  EXPECT_ERROR(error_of(c), "train.accumulate: must be between 1");
}

// runtime.transport selects the backend: every one compiled in is accepted and reaches the
// pipeline's options; anything else is a ConfigError naming the key.
TEST(TransportConfig, RuntimeTransportSelectsTheBackend) {
  const nlohmann::json cfg{
      {"model", {{"family", "mlp"}, {"in", 8}, {"width", 8}, {"layers", 3}, {"out", 4}}},
      {"data", {{"kind", "synthetic"}, {"batch_size", 8}, {"samples", 64}, {"test_samples", 16}}},
      {"pipeline", {{"stages", 2}, {"micro_batches", 2}}}};
  for (const std::string& backend : comm::transport_backends()) {
    if (backend == "nccl") continue;  // GPUs, one process each: below
    const job::Config c = job::parse_config(cfg, "cfg.json", {"runtime.transport=" + backend});
    EXPECT_EQ(comm::name(job::prepare(c).options.transport.backend), backend);
  }
  // auto: local for threads; for processes nccl between GPUs, else ucx, else gloo.
  EXPECT_EQ(job::parse_config(cfg, "cfg.json", {"runtime.transport=auto"}).runtime.transport, comm::Backend::Local);
  EXPECT_EQ(job::parse_config(cfg, "cfg.json", {"runtime.kind=processes"}).runtime.transport,
            PIPETRAIN_HAVE_UCX ? comm::Backend::Ucx : comm::Backend::Gloo);
  EXPECT_EQ(job::parse_config(cfg, "cfg.json", {"runtime.kind=processes", "runtime.transport=gloo"}).runtime.transport,
            comm::Backend::Gloo);
  // nccl: between GPUs, one process each: refused for threads and for CPU stages, naming why.
  for (const auto& [sets, why] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"runtime.transport=nccl"}, "joins one process per GPU"},
           {{"runtime.transport=nccl", "runtime.kind=processes"}, "these stages run on the CPU"}}) {
    if (!comm::has_transport_backend("nccl")) break;
    try {
      job::parse_config(cfg, "cfg.json", sets);
      ADD_FAILURE() << "nccl was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
  // nccl: between GPUs, one process each; ucx where it is not compiled in.
  for (const std::string& other : {std::string("nccl"), std::string(PIPETRAIN_HAVE_UCX ? "" : "ucx")}) {
    if (other.empty()) continue;
    try {
      job::parse_config(cfg, "cfg.json", {"runtime.transport=" + other});
      ADD_FAILURE() << other << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("runtime.transport"), std::string::npos) << e.what();
    }
  }
}


namespace {
// The config `key=name` over base(), or the message of its ConfigError.
Config parsed(const std::string& key, const std::string& name, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), key + "=" + name);
  return parse_config(base(), "cfg.json", extra);
}

// A set's table: rows in the enum's order, names unique, each with a help text.
template <class E>
void expect_table(const char* set) {
  std::set<std::string> names;
  for (size_t i = 0; i < choices<E>().size(); ++i) {
    const Choice<E>& row = choices<E>()[i];
    EXPECT_EQ(static_cast<size_t>(row.value), i) << set << ": " << row.name;
    EXPECT_TRUE(names.insert(row.name).second) << set << ": " << row.name << " twice";
    EXPECT_GT(std::string(row.help).size(), 0u) << set << ": " << row.name;
    EXPECT_EQ(&choice(row.value), &row) << set;
  }
}

// What a config's unknown value under `key` says: the key, the value, and every accepted name.
void expect_unknown_lists(const std::string& key, const std::vector<std::string>& accepted,
                          std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), key + "=carrier-pigeon");
  const std::string message = error_of(base(), extra);
  EXPECT_ERROR(message, key + "=carrier-pigeon: " + key + ": unknown");  // the override, then the key
  EXPECT_NE(message.find("carrier-pigeon"), std::string::npos) << message;
  EXPECT_NE(message.find(join(accepted, ", ")), std::string::npos) << key << ": " << message;
}
}  // namespace

TEST(ConfigChoices, EveryTableHasARowPerValueInOrder) {
  expect_table<RuntimeKind>("runtime.kind");
  expect_table<DataKind>("data.kind");
  expect_table<BalanceMethod>("pipeline.balance");
  expect_table<DType>("runtime.dtype");
  expect_table<LrSchedule>("optimizer.lr_schedule");
  expect_table<OnNonfinite>("train.on_nonfinite");
  expect_table<TokenDType>("data.dtype");
  for (size_t i = 0; i < comm::backend_table().size(); ++i)
    EXPECT_EQ(static_cast<size_t>(comm::backend_table()[i].backend), i) << comm::backend_table()[i].name;
  // A list is given as one, never by name.
  EXPECT_EQ(choice_names<BalanceMethod>(true), (std::vector<std::string>{"uniform", "parameters", "time", "memory"}));
  EXPECT_FALSE(find_choice<BalanceMethod>("list"));
}

// An unknown value of every closed set is one line naming the key and listing the table's names.
TEST(ConfigChoices, UnknownValuesNameTheKeyAndListTheAcceptedOnes) {
  expect_unknown_lists("runtime.kind", {"threads", "processes"});
  expect_unknown_lists("data.kind", {"synthetic", "fashion-mnist", "text", "tensors", "tokens"});
  expect_unknown_lists("pipeline.balance", {"uniform", "parameters", "time", "memory"});
  expect_unknown_lists("runtime.dtype", {"float32", "float64"});
  expect_unknown_lists("optimizer.lr_schedule", {"constant", "cosine"});
  expect_unknown_lists("train.on_nonfinite", {"stop", "skip"});
  expect_unknown_lists("data.dtype", {"uint16", "uint32", "uint8", "int32", "int64"},
                       {"data.kind=tokens", "data.path=/nonexistent"});
  std::vector<std::string> transports = comm::backend_names();
  transports.emplace_back("auto");
  expect_unknown_lists("runtime.transport", transports);
  EXPECT_ERROR(error_of(base(), {"pipeline.balance=list"}), "pipeline.balance: unknown method \"list\"");
}

// Every value of every set: parsed from its name into the row's value, and written back out
// (messages, checkpoints, plans) as the same name; the config's JSON is kept as written.
TEST(ConfigChoices, EveryValueRoundTripsThroughParseAndWriteBack) {
  auto round_trip = [](const std::string& key, const std::string& name, auto value, auto got,
                       const Config& c) {
    EXPECT_EQ(got, value) << key << "=" << name;
    EXPECT_EQ(choice_name(got), name) << key;
    const std::string section = key.substr(0, key.find('.')), leaf = key.substr(key.find('.') + 1);
    EXPECT_EQ(c.root.at(section).at(leaf).dump(), json(name).dump()) << key;
  };
  for (const auto& row : choices<RuntimeKind>()) {
    const Config c = parsed("runtime.kind", row.name, {"runtime.transport=gloo"});
    round_trip("runtime.kind", row.name, row.value, c.runtime.kind, c);
  }
  for (const auto& row : choices<DataKind>()) {
    const Config c = parsed("data.kind", row.name, {"data.path=/nonexistent"});
    round_trip("data.kind", row.name, row.value, c.data.kind, c);
  }
  for (const auto& row : choices<BalanceMethod>()) {
    if (!row.spelled) continue;
    const Config c = parsed("pipeline.balance", row.name);
    EXPECT_EQ(c.pipeline.balance_method, row.value) << row.name;
    EXPECT_EQ(choice_name(c.pipeline.balance_method), std::string(row.name));
  }
  EXPECT_EQ(parsed("pipeline.balance", "[2,1]").pipeline.balance_method, BalanceMethod::List);
  for (const auto& row : choices<DType>()) {
    const Config c = parsed("runtime.dtype", row.name);
    round_trip("runtime.dtype", row.name, row.value, c.runtime.dtype, c);
    EXPECT_EQ(checkpoint::training_identity(c).at("dtype"), json(row.name));  // a checkpoint's identity
  }
  for (const auto& row : choices<LrSchedule>()) {
    const Config c = parsed("optimizer.lr_schedule", row.name);
    round_trip("optimizer.lr_schedule", row.name, row.value, c.optimizer.lr_schedule, c);
  }
  for (const auto& row : choices<OnNonfinite>()) {
    const Config c = parsed("train.on_nonfinite", row.name);
    round_trip("train.on_nonfinite", row.name, row.value, c.train.on_nonfinite, c);
  }
  for (const auto& row : choices<TokenDType>()) {
    const Config c = parsed("data.dtype", row.name, {"data.kind=tokens", "data.path=/nonexistent"});
    ASSERT_TRUE(c.data.dtype) << row.name;
    round_trip("data.dtype", row.name, row.value, *c.data.dtype, c);
  }
  EXPECT_FALSE(parsed("data.kind", "tokens", {"data.path=/nonexistent"}).data.dtype);  // unset: the file says
  for (const auto& row : comm::backend_table()) {
    if (!row.compiled || !row.threads) continue;  // refused for threads: TransportConfig above
    const Config c = parsed("runtime.transport", row.name);
    EXPECT_EQ(c.runtime.transport, row.backend) << row.name;
    EXPECT_STREQ(comm::name(c.runtime.transport), row.name);
    EXPECT_EQ(comm::parse_backend(row.name), row.backend);
  }
}
