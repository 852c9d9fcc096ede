// The layer-list model (model.family "layers"): the built-in families spelled as layer lists build
// the same parameters and compute the same outputs, dropout masks included; shapes are checked
// when the model is built, naming the layer and both shapes; skips merge across stages; ties hold.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "common/error.h"
#include "common/replayable.h"
#include "common/rng.h"
#include "common/json_reader.h"
#include "models/decoder.h"
#include "models/families.h"
#include "models/model.h"
#include "models/skip.h"
#include "tests/layer_list_helpers.h"
#include "pipeline/pipeline.h"
#include "tests/cli_helpers.h"
#include "tests/helpers.h"

using namespace pipetrain;
using nlohmann::json;

namespace {

models::Model build(json cfg, uint64_t seed = 3) { return test::build_model_section(cfg, seed); }
using test::build_error;
using test::llama_list;

// Same parameters in the same order (values and shapes), and the same training-mode output for
// the same random context: the spelling is the preset.
void expect_same_model(const models::Model& a, const models::Model& b, const at::Tensor& x, const std::string& what) {
  const auto pa = a.layers->parameters(), pb = b.layers->parameters();
  ASSERT_EQ(pa.size(), pb.size()) << what;
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_EQ(pa[i].sizes(), pb[i].sizes()) << what << ": parameter " << i;
    EXPECT_TRUE(torch::equal(pa[i], pb[i])) << what << ": parameter " << i;
  }
  EXPECT_EQ(a.sample_shape, b.sample_shape) << what;
  EXPECT_EQ(a.classes, b.classes) << what;
  EXPECT_EQ(a.token_input, b.token_input) << what;
  EXPECT_EQ(a.ties.size(), b.ties.size()) << what;
  RngContextGuard rng(RngContext{5, 2, 0});
  const at::Tensor ya = models::forward_with_skips(a.layers, x), yb = models::forward_with_skips(b.layers, x);
  EXPECT_TRUE(torch::equal(ya, yb)) << what;
}

json linear(const std::string& name, int64_t in, int64_t out) {
  return {{"name", name}, {"type", "linear"}, {"in_features", in}, {"out_features", out}};
}

TEST(LayerList, TheFamiliesSpelledAsListsAreThePresets) {
  // mlp: fcN = linear, relu, dropout (its own stream each), then the head.
  json mlp_layers = json::array();
  for (int i = 0; i < 3; ++i) {
    mlp_layers.push_back(linear("fc" + std::to_string(i + 1), i == 0 ? 12 : 16, 16));
    mlp_layers.push_back({{"name", "relu" + std::to_string(i + 1)}, {"type", "relu"}});
    mlp_layers.push_back({{"name", "drop" + std::to_string(i + 1)}, {"type", "dropout"}, {"p", 0.3}});
  }
  mlp_layers.push_back(linear("head", 16, 5));
  expect_same_model(build({{"family", "mlp"}, {"in", 12}, {"width", 16}, {"layers", 3}, {"out", 5}, {"dropout", 0.3}}),
                    build({{"family", "layers"}, {"input_shape", {12}}, {"layers", mlp_layers}}), torch::randn({6, 12}),
                    "mlp");

  // cnn: conv blocks (conv, batch norm, relu, pool), the fc with dropout, the head.
  json cnn = json::array();
  const int64_t c = 4;
  auto conv = [&](const std::string& n, int64_t in, int64_t out, bool pool) {
    cnn.push_back({{"name", n}, {"type", "conv2d"}, {"in_channels", in}, {"out_channels", out}, {"kernel_size", 3},
                   {"padding", 1}, {"bias", false}});
    cnn.push_back({{"name", n + "_bn"}, {"type", "batchnorm2d"}, {"num_features", out}});
    cnn.push_back({{"name", n + "_relu"}, {"type", "relu"}});
    if (pool) cnn.push_back({{"name", n + "_pool"}, {"type", "maxpool2d"}, {"kernel_size", 2}});
  };
  conv("conv1", 1, c, true);
  conv("conv2", c, 2 * c, true);
  conv("conv3", 2 * c, 2 * c, false);
  cnn.push_back({{"name", "flat"}, {"type", "flatten"}});
  cnn.push_back(linear("fc", 2 * c * 4 * 4, 10));
  cnn.push_back({{"name", "fc_relu"}, {"type", "relu"}});
  cnn.push_back({{"name", "fc_drop"}, {"type", "dropout"}, {"p", 0.25}});
  cnn.push_back(linear("head", 10, 3));
  expect_same_model(build({{"family", "cnn"}, {"image_size", 16}, {"channels", c}, {"hidden", 10}, {"classes", 3},
                           {"batch_norm", true}}),
                    build({{"family", "layers"}, {"input_shape", {1, 16, 16}}, {"layers", cnn}}),
                    torch::randn({4, 1, 16, 16}), "cnn");

  // gpt: token and position embedding, repeated blocks, the norm, the head tied to the embedding.
  const json blocks = {{"type", "repeat"}, {"count", 2},
                       {"layers", {{{"name", "block"}, {"type", "transformer_block"}, {"d_model", 16}, {"n_heads", 2},
                                    {"d_ff", 24}, {"dropout", 0.1}}}}};
  const json gpt = {{"family", "layers"},
                    {"input_shape", {8}},
                    {"input_dtype", "long"},
                    {"layers",
                     {{{"name", "embed"}, {"type", "embedding"}, {"num_embeddings", 32}, {"embedding_dim", 16},
                       {"max_positions", 8}, {"dropout", 0.1}},
                      blocks,
                      {{"name", "norm"}, {"type", "layernorm"}, {"normalized_shape", 16}},
                      linear("head", 16, 32)}},
                    {"ties", json::array({json::array({"embed.embedding.tok.weight", "head.linear.weight"})})}};
  const models::Model list = build(gpt);
  EXPECT_EQ(models::layer_names(list.layers), (std::vector<std::string>{"embed", "block_0", "block_1", "norm", "head"}));
  {  // the preset starts its tied weight at GPT-2's scale (models/gpt.cpp); a list keeps its layers' own
    torch::NoGradGuard no_grad;
    auto p = list.layers->named_parameters();
    p["embed.embedding.tok.weight"].mul_(models::kTiedEmbeddingStd);
    p["head.linear.weight"].copy_(p["embed.embedding.tok.weight"]);
  }
  expect_same_model(build({{"family", "gpt"}, {"vocab_size", 32}, {"seq_len", 8}, {"d_model", 16}, {"n_heads", 2},
                           {"n_layers", 2}, {"d_ff", 24}, {"dropout", 0.1}, {"tie_embeddings", true}}),
                    list, torch::randint(0, 32, {3, 8}), "gpt");
}

TEST(LayerList, ShapeMismatchesNameTheLayerAndBothShapes) {
  auto cfg = [](json layers) { return json{{"family", "layers"}, {"input_shape", {1, 8, 8}}, {"layers", layers}}; };
  const json c1 = {{"name", "c1"}, {"type", "conv2d"}, {"in_channels", 1}, {"out_channels", 16}, {"kernel_size", 3}};
  const json c2 = {{"name", "conv2"}, {"type", "conv2d"}, {"in_channels", 32}, {"out_channels", 8}, {"kernel_size", 3}};
  const json relu = {{"name", "r"}, {"type", "relu"}};
  EXPECT_EQ(build_error(cfg({c1, relu, relu, c2})),
            "test.json: model.layers[2].name: 'r' names another layer already");
  EXPECT_EQ(build_error(cfg({c1, relu, {{"name", "r2"}, {"type", "identity"}}, c2})),
            "test.json: model.layers[3] (conv2): expects 32 input channels, gets 16 (input [16, 6, 6])");
  EXPECT_EQ(build_error(cfg({c1, {{"name", "f"}, {"type", "flatten"}}, linear("fc", 100, 4)})),
            "test.json: model.layers[2] (fc): expects 100 input features, gets 576 (input [576])");
  EXPECT_NE(build_error(cfg({{{"name", "c"}, {"type", "conv3d"}}})).find("model.layers[0].type"), std::string::npos);
  EXPECT_NE(build_error(cfg({c1, {{"name", "p"}, {"type", "maxpool2d"}, {"kernel_size", 7}}})).find("(p): a window of 7 does not fit"),
            std::string::npos);
  EXPECT_EQ(build_error(cfg({{{"name", "e"}, {"type", "embedding"}, {"num_embeddings", 4}, {"embedding_dim", 2}}})),
            "test.json: model.layers[0] (e): takes token ids (model.input_dtype \"long\"), gets float input");
  // Skips: merged by name, shapes checked, never left open.
  json stashed = c1;
  stashed["stash"] = "s";
  EXPECT_EQ(build_error(cfg({stashed, relu})), "test.json: model.layers: 's' is stashed and never merged (add or concat with \"from\")");
  EXPECT_EQ(build_error(cfg({c1, {{"name", "a"}, {"type", "add"}, {"from", "s"}}})),
            "test.json: model.layers[1].from: 's' is not stashed by a layer before this one (or was merged already)");
  EXPECT_EQ(build_error(cfg({stashed, {{"name", "f"}, {"type", "flatten"}}, {{"name", "a"}, {"type", "add"}, {"from", "s"}}})),
            "test.json: model.layers[2] (a): adds s of [16, 6, 6] to [576]");
  // Too many layers, after repeats: one line, before anything large is built.
  json many = json::array();
  for (int i = 0; i < 10000; ++i) many.push_back({{"name", "r" + std::to_string(i)}, {"type", "relu"}});
  EXPECT_EQ(build_error(cfg(many)), "test.json: model.layers[4096].type: the list makes more than 4096 layers (after repeats)");
  const json deep = {{"type", "repeat"}, {"count", 4096}, {"layers", json::array({{{"type", "repeat"}, {"count", 4096}, {"layers", json::array({relu})}}})}};
  EXPECT_NE(build_error(cfg(json::array({deep}))).find("the list makes more than 4096 layers"), std::string::npos);
  EXPECT_EQ(build_error({{"family", "layers"}, {"input_shape", {4}}, {"layers", {linear("a", 4, 4)}}, {"ties", json::array({json::array({"a.linear.weight", "b.w"})})}}),
            "test.json: model.ties[0]: 'b.w' is not a parameter of the model (names are <layer>.<module>.<parameter>, e.g. a.linear.weight)");
  EXPECT_EQ(build_error({{"family", "layers"}, {"input_shape", {4}}, {"layers", {linear("a", 4, 4)}}, {"ties", json::array({json::array({"a.linear.weight", "a.linear.weight"})})}}),
            "test.json: model.ties[0]: names 'a.linear.weight' twice");
}

// Sizes beyond what a machine holds are refused before a tensor is made, naming the layer; no
// product of sizes overflows on the way.
TEST(LayerList, SizesBeyondTheMachineAreRefusedBeforeAnythingIsMade) {
  const double limit = models::parameter_limit();
  EXPECT_GT(limit, 1e8);  // this machine's memory in float32 values, at least 400 MB
  const int64_t big = int64_t{1} << 30;
  const std::string e = build_error({{"family", "layers"}, {"input_shape", {4}}, {"layers", {linear("a", 4, 8), linear("huge", 8, big), linear("b", big, big)}}});
  EXPECT_EQ(e.rfind("test.json: model.layers[1] (huge): brings the model to ", 0), 0u) << e;
  EXPECT_NE(e.find("more than this machine's memory holds"), std::string::npos) << e;
  models::set_parameter_limit(100);  // what a program building untrusted lists sets
  EXPECT_EQ(build_error({{"family", "layers"}, {"input_shape", {4}}, {"layers", {linear("a", 4, 8), linear("b", 8, 8)}}}),
            "test.json: model.layers[1] (b): brings the model to 112 parameter values (448 B in float32), more than this "
            "machine's memory holds (400 B)");
  models::set_parameter_limit(limit);
  EXPECT_EQ(build_error({{"family", "layers"}, {"input_shape", {big, big}}, {"layers", {linear("a", big, 2)}}}),
            "test.json: model.input_shape: more than 2^40 values per sample");
  EXPECT_EQ(build_error({{"family", "layers"}, {"input_shape", {1, 1024, 1024}},
                         {"layers", {{{"name", "up"}, {"type", "conv2d"}, {"in_channels", 1}, {"out_channels", big}, {"kernel_size", 1}}}}}),
            "test.json: model.layers[0] (up): gives samples of [1073741824, 1024, 1024]: more than 2^40 values each");
  EXPECT_EQ(build_error({{"family", "layers"}, {"input_shape", {64}}, {"layers", {{{"name", "r"}, {"type", "reshape"}, {"shape", {big, big, big, -1}}}}}}),
            "test.json: model.layers[0] (r): reshapes [64] (64 values) into [1073741824, 1073741824, 1073741824, -1]");
  EXPECT_EQ(build_error({{"family", "layers"}, {"input_shape", {64}}, {"layers", {{{"name", "r"}, {"type", "reshape"}, {"shape", {64, 64, -1}}}}}}),
            "test.json: model.layers[0] (r): reshapes [64] (64 values) into [64, 64, -1]");
}

// A U-Net-like list: an encoder stashes, the decoder concatenates and adds across stage
// boundaries; the pipeline's gradients equal one device's, in float64.
TEST(LayerList, SkipsMergeAcrossStages) {
  const json cfg = {
      {"family", "layers"},
      {"input_shape", {2, 8, 8}},
      {"layers",
       {{{"name", "enc"}, {"type", "conv2d"}, {"in_channels", 2}, {"out_channels", 4}, {"kernel_size", 3}, {"padding", 1}, {"stash", "e"}},
        {{"name", "act"}, {"type", "silu"}, {"stash", "a"}},
        {{"name", "mid"}, {"type", "conv2d"}, {"in_channels", 4}, {"out_channels", 4}, {"kernel_size", 3}, {"padding", 1}},
        {{"name", "cat"}, {"type", "concat"}, {"from", "e"}},
        {{"name", "dec"}, {"type", "conv2d"}, {"in_channels", 8}, {"out_channels", 4}, {"kernel_size", 1}},
        {{"name", "plus"}, {"type", "add"}, {"from", "a"}},
        {{"name", "pool"}, {"type", "adaptiveavgpool2d"}, {"output_size", 2}},
        {{"name", "flat"}, {"type", "flatten"}},
        {{"name", "norm"}, {"type", "rmsnorm"}, {"normalized_shape", 16}},
        linear("head", 16, 3)}}};
  models::Model ref = build(cfg), m = build(cfg);
  ref.layers->to(torch::kDouble);
  m.layers->to(torch::kDouble);
  const at::Tensor x = torch::randn({8, 2, 8, 8}, torch::kDouble), y = torch::randint(0, 3, {8});
  auto loss = [](const at::Tensor& out, const at::Tensor& t) { return torch::nn::functional::cross_entropy(out, t); };
  const at::Tensor l = loss(models::forward_with_skips(ref.layers, x), y);
  l.backward();
  pipeline::PipelineOptions o;
  o.stages = 3;
  o.micro_batches = 1;
  pipeline::Pipeline pipe(m.layers, o, loss);
  EXPECT_NEAR(pipe.forward_backward(x, y), l.item<double>(), 1e-12);
  for (const auto& p : ref.layers->named_parameters()) {
    const at::Tensor g = m.layers->named_parameters()[p.key()].grad();
    ASSERT_TRUE(g.defined()) << p.key();
    EXPECT_LT((g - p.value().grad()).abs().max().item<double>(), 1e-10) << p.key();
  }
}

// The shipped layer-list config through the binary: plan shows the names it writes, it trains (on
// synthetic data of its shape, here), and an override of a layer's argument is checked as the file.
TEST(LayerList, TheShippedConfigPlansWithItsNamesAndTrains) {
  const std::string cfg = std::string(PIPETRAIN_SOURCE_DIR) + "/configs/lenet5_fashion_mnist.json";
  const std::string synthetic = " --set data.kind=synthetic --set data.samples=256 --set data.test_samples=64";
  Result r = run("plan " + cfg + synthetic);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("c1 .. "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" .. out"), std::string::npos) << r.out;
  Result t = run("train " + cfg + synthetic + " --steps 3 --quiet");
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_NE(t.out.find("test accuracy"), std::string::npos) << t.out;
  Result bad = run("train " + cfg + synthetic + " --set model.layers.7.in_features=1000 --steps 1");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("model.layers[7] (c5): expects 1000 input features, gets 400 (input [400])"), std::string::npos)
      << bad.out;
}


}  // namespace

// permute, transpose and mean: a ViT-style list (patches as a sequence, mean-pooled), whose
// shapes are worked out when built and whose values are torch's own operations.
TEST(LayerList, PermuteTransposeAndMeanWriteAVitStyleList) {
  const json layers = json::array({
      {{"name", "patches"}, {"type", "conv2d"}, {"in_channels", 1}, {"out_channels", 8}, {"kernel_size", 4}, {"stride", 4}},
      {{"name", "seq"}, {"type", "flatten"}, {"start_dim", 2}},                          // [8, 49]
      {{"name", "tokens"}, {"type", "transpose"}, {"dim0", 1}, {"dim1", 2}},             // [49, 8]
      {{"name", "mix"}, {"type", "llama_block"}, {"d_model", 8}, {"n_heads", 2}, {"d_ff", 16}},
      {{"name", "back"}, {"type", "permute"}, {"dims", {0, 2, 1}}},                       // [8, 49]
      {{"name", "pool"}, {"type", "mean"}, {"dim", -1}},                                 // [8]
      linear("head", 8, 10)});
  models::Model m = build({{"family", "layers"}, {"input_shape", {1, 28, 28}}, {"layers", layers}});
  EXPECT_EQ(m.classes, 10);
  const at::Tensor x = torch::randn({3, 1, 28, 28});
  EXPECT_EQ(m.layers->forward(x).sizes(), (std::vector<int64_t>{3, 10}));
  // Each equals torch's operation on the output before it.
  auto layer = [&](long i, const at::Tensor& t) { return (m.layers->begin() + i)->forward(t); };
  const at::Tensor a = layer(1, layer(0, x));
  const at::Tensor b = layer(2, a);
  EXPECT_TRUE(torch::equal(b, a.transpose(1, 2)));
  const at::Tensor c = layer(3, b);
  const at::Tensor d = layer(4, c);
  EXPECT_TRUE(torch::equal(d, c.permute({0, 2, 1})));
  EXPECT_TRUE(torch::equal(layer(5, d), d.mean(2)));

  auto list = [&](json extra) {
    json l = layers;
    l[4] = extra;
    return json{{"family", "layers"}, {"input_shape", {1, 28, 28}}, {"layers", l}};
  };
  EXPECT_NE(build_error(list({{"name", "back"}, {"type", "permute"}, {"dims", {1, 0, 2}}})).find("must keep the batch (dimension 0) first"), std::string::npos);
  EXPECT_NE(build_error(list({{"name", "back"}, {"type", "permute"}, {"dims", {0, 1, 1}}})).find("each once"), std::string::npos);
  EXPECT_NE(build_error(list({{"name", "back"}, {"type", "transpose"}, {"dim0", 0}, {"dim1", 1}})).find("dimension 0 is the batch"), std::string::npos);
  EXPECT_NE(build_error(list({{"name", "back"}, {"type", "mean"}, {"dim", 3}})).find("is not a dimension of a sample"), std::string::npos);
}

// llama_block's arguments: grouped-query heads must divide, the rope kind is one of those
// supported with the parameters it needs, and a mismatch of d_model names both.
TEST(LayerList, LlamaBlockArgumentsAreChecked) {
  auto block = [](json extra) {
    json b{{"name", "b"}, {"type", "llama_block"}, {"d_model", 16}, {"n_heads", 4}, {"d_ff", 32}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return json{{"family", "layers"}, {"input_shape", {6}}, {"input_dtype", "long"},
                {"layers", {{{"name", "e"}, {"type", "embedding"}, {"num_embeddings", 20}, {"embedding_dim", 16}}, b, linear("h", 16, 20)}}};
  };
  EXPECT_EQ(build_error(block({{"n_kv_heads", 2}})), "(built)");
  EXPECT_NE(build_error(block({{"n_kv_heads", 3}})).find("n_kv_heads: must divide n_heads (4)"), std::string::npos);
  EXPECT_NE(build_error(block({{"rope_scaling", {{"rope_type", "dynamic"}}}})).find("original_max_position_embeddings: is required by dynamic"), std::string::npos);
  // Ministral 3's query scale needs the length it counts positions in.
  EXPECT_NE(build_error(block({{"q_scale_beta", 0.1}})).find("q_scale_length: is required with q_scale_beta"), std::string::npos);
  EXPECT_NE(build_error(block({{"q_scale_length", 4}})).find("q_scale_length: needs q_scale_beta above 0"), std::string::npos);
  // yarn and longrope need the pretraining length; longrope a factor per rotated pair (head_dim 4
  // turns 2 pairs, and partial_rotary_factor 0.5 one); the rotation turns an even count.
  EXPECT_NE(build_error(block({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4}}}})).find("original_max_position_embeddings: is required by yarn"),
            std::string::npos);
  const json longrope{{"rope_type", "longrope"}, {"original_max_position_embeddings", 4}, {"short_factor", {1, 2}}, {"long_factor", {3, 4}}};
  EXPECT_EQ(build_error(block({{"rope_scaling", longrope}})), "(built)");
  EXPECT_NE(build_error(block({{"rope_scaling", longrope}, {"partial_rotary_factor", 0.5}})).find("short_factor: must hold 1 factors (one per rotated pair), got 2"),
            std::string::npos);
  json bad = longrope;
  bad["long_factor"] = {3, -1};
  EXPECT_NE(build_error(block({{"rope_scaling", bad}})).find("long_factor: must be positive, got -1"), std::string::npos);
  EXPECT_NE(build_error(block({{"partial_rotary_factor", 0.25}})).find("turns 1 of head_dim's 4 values; it must be an even number above 0"),
            std::string::npos);
  EXPECT_NE(build_error(block({{"d_model", 24}})).find("expects d_model 24, gets 16"), std::string::npos);
  EXPECT_NE(build_error(block({{"head_dim", 5}})).find("must be even"), std::string::npos);
  // A sliding window of 3: the last position's output does not depend on the first tokens, as
  // it does without the window.
  for (int window : {3, 0}) {
    models::Model m = build(block({{"n_kv_heads", 2}, {"sliding_window", window}, {"qkv_bias", true}}));
    m.layers->to(torch::kDouble);
    const at::Tensor x = torch::randint(0, 20, {1, 6});
    at::Tensor changed = x.clone();
    changed[0][0] = (x[0][0].item<int64_t>() + 1) % 20;
    changed[0][1] = (x[0][1].item<int64_t>() + 1) % 20;
    const at::Tensor last = m.layers->forward(x).select(1, 5), last_changed = m.layers->forward(changed).select(1, 5);
    EXPECT_EQ(torch::equal(last, last_changed), window == 3) << "window " << window;
  }
}

// An embedding's padding_idx: that token's row takes no gradient (torch.nn.Embedding's, which
// transformers' models take from pad_token_id), the others do; checked against the layer.
TEST(LayerList, AnEmbeddingsPaddingRowTakesNoGradient) {
  auto list = [](json embedding_extra) {
    json e{{"name", "e"}, {"type", "embedding"}, {"num_embeddings", 10}, {"embedding_dim", 4}};
    for (auto& [k, v] : embedding_extra.items()) e[k] = v;
    return json{{"family", "layers"}, {"input_shape", {5}}, {"input_dtype", "long"}, {"layers", {e, linear("h", 4, 10)}}};
  };
  models::Model m = build(list({{"padding_idx", 3}}));
  const at::Tensor x = torch::tensor({{3, 1, 3, 2, 3}}, torch::kLong);
  m.layers->forward(x).sum().backward();
  const at::Tensor g = m.layers->named_parameters()["e.embedding.weight"].grad();
  EXPECT_TRUE(torch::equal(g[3], torch::zeros({4}))) << "the padding row took a gradient";
  EXPECT_FALSE(torch::equal(g[1], torch::zeros({4}))) << "a token's row took none";
  EXPECT_NE(build_error(list({{"padding_idx", 10}})).find("padding_idx: must be between 0 and 9, got 10"), std::string::npos)
      << build_error(list({{"padding_idx", 10}}));
  EXPECT_NE(build_error(list({{"padding_idx", 0}, {"max_positions", 5}})).find("padding_idx: needs an embedding without max_positions"),
            std::string::npos)
      << build_error(list({{"padding_idx", 0}, {"max_positions", 5}}));
}

// The pieces OLMo 2 and the Gemmas need, as list arguments: an RMSNorm's scale applied after the
// cast back (Llama's), before it (OLMo 2's: another bfloat16 result) or as 1 + weight (Gemma's,
// the weight zeros at the start); an embedding's scale (a float32 value); the softcap layer; the
// llama_block's norm placements, each with its norms' parameters.
TEST(LayerList, OlmoAndGemmaPiecesAreListArguments) {
  auto norm_list = [](const std::string& scale) {
    return json{{"family", "layers"}, {"input_shape", {4, 8}},
                {"layers", {{{"name", "n"}, {"type", "rmsnorm"}, {"normalized_shape", 8}, {"scale", scale}}}}};
  };
  const at::Tensor x = torch::randn({2, 4, 8}), w = torch::randn({8});
  const at::Tensor xb = x.to(torch::kBFloat16), wb = w.to(torch::kBFloat16);
  const at::Tensor normed = xb.to(torch::kFloat) * torch::rsqrt(xb.to(torch::kFloat).pow(2).mean(-1, true) + 1e-6);
  std::map<std::string, at::Tensor> out;
  for (const std::string scale : {"after_cast", "before_cast", "one_plus"}) {
    models::Model m = build(norm_list(scale));
    at::Tensor p = m.layers->named_parameters()["n.rms.weight"];
    EXPECT_TRUE(torch::equal(p, scale == "one_plus" ? torch::zeros({8}) : torch::ones({8}))) << scale;
    m.layers->to(torch::kBFloat16);
    torch::NoGradGuard no_grad;
    m.layers->named_parameters()["n.rms.weight"].copy_(wb);
    out[scale] = m.layers->forward(xb);
  }
  EXPECT_TRUE(torch::equal(out["after_cast"], wb * normed.to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(out["before_cast"], (wb * normed).to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(out["one_plus"], (normed * (1 + wb.to(torch::kFloat))).to(torch::kBFloat16)));
  EXPECT_FALSE(torch::equal(out["after_cast"], out["before_cast"]));  // bfloat16 rounds them apart
  EXPECT_NE(build_error(norm_list("gemma")).find("scale"), std::string::npos);

  const json emb{{"family", "layers"}, {"input_shape", {5}}, {"input_dtype", "long"},
                 {"layers", {{{"name", "e"}, {"type", "embedding"}, {"num_embeddings", 10}, {"embedding_dim", 4}, {"scale", 2.5}},
                             {{"name", "c"}, {"type", "softcap"}, {"cap", 0.5}}}}};
  models::Model m = build(emb);
  const at::Tensor ids = torch::randint(0, 10, {1, 5});
  const at::Tensor scaled = m.layers->named_parameters()["e.embedding.weight"].index_select(0, ids.view({-1})).view({1, 5, 4}) * 2.5f;
  EXPECT_TRUE(torch::allclose(m.layers->forward(ids), torch::tanh(scaled / 0.5) * 0.5, 1e-6, 1e-7));
  json no_cap = emb;
  no_cap["layers"][1].erase("cap");
  EXPECT_NE(build_error(no_cap).find("cap: is required"), std::string::npos) << build_error(no_cap);

  auto block = [](const json& extra) { return llama_list(extra, {{"d_model", 16}, {"n_heads", 4}, {"d_ff", 32}}); };
  auto norms_of = [&](json extra) {
    std::vector<std::string> names;
    for (const auto& p : build(block(std::move(extra))).layers->named_parameters())
      if (p.key().find("layernorm") != std::string::npos || p.key().find("_norm") != std::string::npos) names.push_back(p.key());
    return names;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(norms_of({}), (V{"b.llama.input_layernorm.weight", "b.llama.post_attention_layernorm.weight"}));
  EXPECT_EQ(norms_of({{"norms", "post"}, {"qk_norm", true}, {"qk_norm_over", "projection"}}),
            (V{"b.llama.self_attn.q_norm.weight", "b.llama.self_attn.k_norm.weight", "b.llama.post_attention_layernorm.weight",
               "b.llama.post_feedforward_layernorm.weight"}));
  EXPECT_EQ(norms_of({{"norms", "sandwich"}}), (V{"b.llama.input_layernorm.weight", "b.llama.post_attention_layernorm.weight",
                                                   "b.llama.pre_feedforward_layernorm.weight", "b.llama.post_feedforward_layernorm.weight"}));
  EXPECT_EQ(build(block({{"qk_norm", true}, {"qk_norm_over", "projection"}})).layers->named_parameters()["b.llama.self_attn.q_norm.weight"].numel(), 16);
  EXPECT_NE(build_error(block({{"norms", "middle"}})).find("norms"), std::string::npos);
  EXPECT_NE(build_error(block({{"act", "relu"}})).find("act"), std::string::npos);
}

// A llama_block's mixture of experts: one expert, chosen for every token with weight 1, is the
// dense MLP with its weights; it tells a CUDA graph it cannot be replayed; with more experts,
// renormalizing the chosen experts' probabilities changes the output; the arguments are checked.
TEST(LayerList, AMixtureOfOneExpertIsTheDenseMlp) {
  auto block = [](const json& extra) { return llama_list(extra); };
  models::Model dense = build(block({})), moe = build(block({{"experts", 1}, {"experts_per_token", 1}}));
  dense.layers->to(torch::kDouble);
  moe.layers->to(torch::kDouble);
  auto dp = dense.layers->named_parameters();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : moe.layers->named_parameters()) {
      std::string name = p.key();
      const auto at = name.find("mlp.experts.0.");
      if (at != std::string::npos) name.replace(at, std::string("mlp.experts.0.").size(), "mlp.");
      if (dp.contains(name)) p.value().copy_(dp[name]);
    }
  }
  EXPECT_EQ(moe.layers->named_parameters()["b.llama.mlp.gate.weight"].sizes(), (std::vector<int64_t>{1, 16}));
  const at::Tensor x = torch::randint(0, 20, {3, 6});
  take_not_replayable();
  const at::Tensor dense_out = dense.layers->forward(x);
  EXPECT_EQ(take_not_replayable(), "");
  EXPECT_TRUE(torch::equal(moe.layers->forward(x), dense_out));
  // A CUDA graph cannot replay the routing: the stage runs such a layer eagerly, saying why.
  EXPECT_NE(take_not_replayable().find("mixture of experts reads its routing on the host"), std::string::npos);

  models::Model a = build(block({{"experts", 3}})), b = build(block({{"experts", 3}, {"normalize_experts", false}}));
  EXPECT_FALSE(torch::allclose(a.layers->forward(x), b.layers->forward(x)));  // same weights (same seed), other sums
  EXPECT_NE(build_error(block({{"experts_per_token", 2}})).find("experts_per_token: needs experts above 0"), std::string::npos);
  EXPECT_NE(build_error(block({{"experts", 3}, {"experts_per_token", 4}})).find("experts_per_token"), std::string::npos);
  // A shared expert without its gate (GraniteMoeShared's) adds the whole of what the gated one
  // adds half of with its gate at 0 (sigmoid(0) = 1/2): 2·gated − ungated is the experts alone.
  models::Model gated = build(block({{"experts", 3}, {"shared_expert", 8}}));
  models::Model ungated = build(block({{"experts", 3}, {"shared_expert", 8}, {"shared_expert_gate", false}}));
  models::Model alone = build(block({{"experts", 3}}));
  EXPECT_FALSE(ungated.layers->named_parameters().contains("b.llama.mlp.shared_expert_gate.weight"));
  EXPECT_EQ(gated.layers->named_parameters().size(), ungated.layers->named_parameters().size() + 1);
  {
    torch::NoGradGuard no_grad;
    for (models::Model* m : {&gated, &ungated, &alone}) m->layers->to(torch::kDouble);
    auto g = gated.layers->named_parameters();
    g["b.llama.mlp.shared_expert_gate.weight"].zero_();
    for (models::Model* m : {&ungated, &alone})
      for (auto& p : m->layers->named_parameters()) p.value().copy_(g[p.key()]);
  }
  const at::Tensor half = gated.layers->forward(x), whole = ungated.layers->forward(x);
  EXPECT_FALSE(torch::allclose(half, whole));
  EXPECT_LE((2 * half - whole - alone.layers->forward(x)).abs().max().item<double>(), 1e-12);
  EXPECT_NE(build_error(block({{"experts", 3}, {"shared_expert_gate", false}})).find("shared_expert_gate: needs shared_expert above 0"),
            std::string::npos);
}
