// The equivalence grid's shared fixture (equivalence_test.cpp, equivalence_axes_test.cpp): the
// model families with dropout, their batches, the cases and the fixture, the whole-batch helpers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <utility>

#include <torch/torch.h>

#include "comm/transport.h"
#include "job/single_device.h"
#include "common/precision.h"
#include "common/rng.h"
#include "models/model.h"
#include "models/layers.h"
#include "models/skip.h"
#include "pipeline/pipeline.h"
#include "schedule/in_order.h"
#include "schedule/schedule.h"
#include "stages/accelerator.h"
#include "stages/autocast.h"
#include "stages/device.h"
#include "tests/helpers.h"

namespace equivalence {

using nlohmann::json;

// Five layers each, or eight for the mlp and gpt when an interleaved schedule needs more
// virtual stages (the cnn has five layers, so it is interleaved on at most two stages).
inline json family_config(const std::string& family, bool deep = false) {
  if (family == "unet")  // skips crossing one and two stage boundaries
    return {{"family", "unet"}, {"image_size", 8}, {"channels", 2}, {"classes", 5}, {"dropout", 0.2}};
  if (family == "gpt_tied") {  // the head's weight tied to the token embedding, on the first and last stages
    json g = family_config("gpt", deep);
    g["tie_embeddings"] = true;
    return g;
  }
  if (family == "listconv") {  // a layer list: a conv net with batch norm and a skip (stash, add)
    json layers = json::array(
        {{{"name", "c1"}, {"type", "conv2d"}, {"in_channels", 2}, {"out_channels", 4}, {"kernel_size", 3}, {"padding", 1}, {"stash", "s"}},
         {{"name", "bn1"}, {"type", "batchnorm2d"}, {"num_features", 4}},
         {{"name", "r1"}, {"type", "relu"}},
         {{"name", "c2"}, {"type", "conv2d"}, {"in_channels", 4}, {"out_channels", 4}, {"kernel_size", 3}, {"padding", 1}},
         {{"name", "plus"}, {"type", "add"}, {"from", "s"}},
         {{"name", "pool"}, {"type", "maxpool2d"}, {"kernel_size", 2}},
         {{"name", "flat"}, {"type", "flatten"}},
         {{"name", "fc"}, {"type", "linear"}, {"in_features", 64}, {"out_features", 8}},
         {{"name", "drop"}, {"type", "dropout"}, {"p", 0.3}},
         {{"name", "head"}, {"type", "linear"}, {"in_features", 8}, {"out_features", 3}}});
    return {{"family", "layers"}, {"input_shape", {2, 8, 8}}, {"layers", layers}};
  }
  if (family == "listgpt") {  // a layer list: a transformer stack with repeat, two llama_blocks, a tied embedding
    json layers = json::array(
        {{{"name", "embed"}, {"type", "embedding"}, {"num_embeddings", 11}, {"embedding_dim", 8}, {"max_positions", 6}, {"dropout", 0.2}},
         {{"type", "repeat"}, {"count", deep ? 4 : 2},
          {"layers", json::array({{{"name", "block"}, {"type", "transformer_block"}, {"d_model", 8}, {"n_heads", 2}, {"d_ff", 16}, {"dropout", 0.2}}})}},
         {{"name", "llama"}, {"type", "llama_block"}, {"d_model", 8}, {"n_heads", 2}, {"d_ff", 16}, {"dropout", 0.2}, {"attn_dropout", 0.1}},
         // GPT-NeoX's: attention beside an exact-GELU MLP, each its own LayerNorm, half of each head rotated
         {{"name", "neox"}, {"type", "llama_block"}, {"d_model", 8}, {"n_heads", 2}, {"d_ff", 16}, {"dropout", 0.2}, {"norms", "parallel_two"},
          {"parallel_sum", "branches_first"}, {"norm_center", true}, {"norm_bias", true}, {"act", "gelu"}, {"mlp_gate", false},
          {"partial_rotary_factor", 0.5}, {"qkv_bias", true}},
         {{"name", "mlp"}, {"type", "mlp_block"}, {"d_model", 8}, {"d_ff", 16}, {"dropout", 0.2}},
         {{"name", "norm"}, {"type", "layernorm"}, {"normalized_shape", 8}},
         {{"name", "head"}, {"type", "linear"}, {"in_features", 8}, {"out_features", 11}}});
    return {{"family", "layers"}, {"input_shape", {6}}, {"input_dtype", "long"}, {"layers", layers},
            {"ties", json::array({json::array({"embed.embedding.tok.weight", "head.linear.weight"})})}};
  }
  if (family == "mlp")
    return {{"family", "mlp"}, {"in", 12}, {"width", 16}, {"layers", deep ? 7 : 4}, {"out", 5}, {"dropout", 0.2}};
  if (family == "cnn")
    return {{"family", "cnn"}, {"image_size", 8}, {"channels", 2}, {"hidden", 8}, {"classes", 3}, {"dropout", 0.3}};
  return {{"family", "gpt"}, {"vocab_size", 11}, {"seq_len", 6}, {"d_model", 8}, {"n_heads", 2},
          {"n_layers", deep ? 5 : 2}, {"d_ff", 16}, {"dropout", 0.2}};
}

// Whether a family's config draws dropout masks (the test means nothing if it dropped nothing).
inline bool has_dropout(const json& j) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items())
      if (((k == "dropout" || k == "p") && v.is_number() && v.get<double>() > 0) || has_dropout(v)) return true;
  } else if (j.is_array()) {
    for (const auto& v : j)
      if (has_dropout(v)) return true;
  }
  return false;
}

inline pipetrain::models::Model build(const std::string& family, at::ScalarType dtype, bool deep) {
  pipetrain::JsonReader r(family_config(family, deep), "model", "test");
  pipetrain::models::Model m = pipetrain::models::build(r, /*seed=*/42);
  m.layers->to(dtype);
  return m;
}

struct Batch {
  at::Tensor input, target;
};

inline Batch make_batch(const pipetrain::models::Model& m, int64_t n, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), m.sample_shape.begin(), m.sample_shape.end());
  if (m.token_input)
    return {torch::randint(0, m.classes, shape, gen, torch::kLong), torch::randint(0, m.classes, shape, gen, torch::kLong)};
  if (m.pixel_targets)  // a class per pixel
    return {torch::randn(shape, gen).to(dtype),
            torch::randint(0, m.classes, {n, m.sample_shape[1], m.sample_shape[2]}, gen, torch::kLong)};
  return {torch::randn(shape, gen).to(dtype), torch::randint(0, m.classes, {n}, gen, torch::kLong)};
}

// The reference: job::SingleDevice on the model's copy `m`, the whole batch in one step or, for a
// reduced precision, micro-batch by micro-batch as the pipeline splits it (its dropout streams and
// loss weights), each forward under the same autocast as a stage's, with one intra-op thread as a
// stage's worker (libtorch splits some reductions by thread, a LayerNorm's weight gradient from a
// bfloat16 input, and bfloat16 partial sums round differently). Returns the loss; the gradients
// (a tie's members each holding their sum) go to .grad.
inline double reference(pipetrain::models::Model& m, const Batch& b, pipetrain::Precision precision, int micro_batches = 1, double scale = 1.0) {
  pipetrain::job::SingleDevice one(m.layers, pipetrain::test::mean_cross_entropy, {}, /*seed=*/42, precision, m.ties);
  if (precision != pipetrain::Precision::FP32 || micro_batches > 1) one.accumulate({micro_batches, scale, /*intra_op_threads=*/1});
  return one.forward_backward(b.input, b.target);
}



// One equivalence case. `ranks` and `transport` say how the pipeline runs: by default as today's
// trainer runs runtime.kind threads (one Pipeline, all stages as its threads, the local transport).
struct Case {
  std::string schedule, family;
  int stages, micro_batches;
  pipetrain::Recompute recompute;
  at::ScalarType dtype;
  bool ranks = false;  // one Pipeline per rank, each with its own endpoint and model copy
  std::string transport = "local";
  pipetrain::Precision precision = pipetrain::Precision::FP32;
  int64_t batch = 10;  // samples; fewer than micro_batches: an epoch's short last batch
  // Where the stages run (stages/device.h): "cpu"; "checking", the checking CPU context, which
  // copies every tensor crossing between stages late, so that a missing wait corrupts the step;
  // "cuda", every stage on cuda:0 (skipped without a GPU).
  std::string device = "cpu";
  // The local transport delivering each pair's messages in the order they were sent, as NCCL does.
  bool in_order = false;
  // Data parallelism: copies of the pipeline (in-process), and the optimizer state sharded across
  // them. These, and fp16, are compared through one optimizer step (SGD, lr 1: each parameter
  // moves by minus its gradient), since a sharded optimizer keeps no whole gradient and fp16
  // gradients are unscaled there.
  int copies = 1;
  bool shard = false;
  // Linear layers' weight gradients deferred to one GEMM per step (PipelineOptions::defer_weight_grads).
  bool defer = false;

  bool stepped() const { return copies > 1 || shard || precision == pipetrain::Precision::FP16; }

  std::string runtime() const {
    return std::string(ranks ? "ranks_" : "threads_") + transport + (in_order ? "_inorder" : "") +
           (device == "cpu" ? "" : "_" + device) + (copies > 1 ? "_D" + std::to_string(copies) : "") +
           (shard ? "_sharded" : "") + (defer ? "_deferW" : "");
  }
};

inline void PrintTo(const Case& c, std::ostream* os) {
  *os << c.schedule << ", " << c.family << ", " << c.stages << " stages, " << c.micro_batches << " micro-batches, "
      << recompute_name(c.recompute) << ", " << (c.dtype == torch::kDouble ? "float64" : "float32") << ", "
      << precision_name(c.precision) << ", " << c.runtime() << ", a batch of " << c.batch;
}

class Equivalence : public ::testing::TestWithParam<Case> {};

inline const pipetrain::Recompute kModes[] = {pipetrain::Recompute::Always, pipetrain::Recompute::ExceptLast, pipetrain::Recompute::Never};

// The sampled runtime shapes (equivalence_test.cpp), reused by the other axes.
std::vector<Case> runtime_cases();
// The case's gtest name: the threads/local grid keeps plain names, other runtimes lead with theirs.
std::string case_name(const ::testing::TestParamInfo<Case>& info);

}  // namespace equivalence
