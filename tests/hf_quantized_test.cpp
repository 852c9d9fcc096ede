// Quantized checkpoints without transformers (models/hf_quantized.h): fp8 blocks (short last
// blocks included) and MXFP4 codes dequantized against values written out here by the formats'
// rules; a Llama directory quantized to fp8 and a GPT-OSS one with MXFP4 experts read back as
// their dequantized weights and exported in float; what is refused, each in one line naming the
// tensor or the field. Against transformers' own dequantization: hf_test.cpp (HfParity.*Dequantized).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/error.h"
#include "models/hf.h"
#include "models/hf_quantized.h"
#include "tests/hf_oracle.h"

using namespace pipetrain;

namespace {

std::string root() { return test::scratch_dir("hf_quantized"); }

// The ConfigError `f` throws (it must throw one), checked to be one line.
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return what;
  }
  ADD_FAILURE() << "no ConfigError";
  return "";
}

// What `expected` names is in `error`.
void expect_in(const std::string& error, const std::string& expected) { EXPECT_NE(error.find(expected), std::string::npos) << error; }

// q's value times its block's scale, each product rounded once to float (exact in double first).
at::Tensor by_hand(const at::Tensor& q, const at::Tensor& scale, int64_t block_rows, int64_t block_cols) {
  const at::Tensor qd = q.to(torch::kDouble), sd = scale.to(torch::kDouble);
  at::Tensor out = torch::empty(q.sizes(), torch::kFloat);
  for (int64_t i = 0; i < q.size(0); ++i)
    for (int64_t j = 0; j < q.size(1); ++j)
      out[i][j] = static_cast<float>(qd[i][j].item<double>() * sd[i / block_rows][j / block_cols].item<double>());
  return out;
}

const nlohmann::json kLlama{{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", 40},
                            {"hidden_size", 16}, {"intermediate_size", 24}, {"num_hidden_layers", 2},
                            {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"rms_norm_eps", 1e-6},
                            {"tie_word_embeddings", false}};

std::map<std::string, at::Tensor> params_of(const models::Model& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.layers->named_parameters()) out[p.key()] = p.value();
  for (const auto& b : m.layers->named_buffers()) out[b.key()] = b.value();
  return out;
}

}  // namespace

TEST(HfQuantized, Fp8BlocksShortOnesIncludedScaleTheirOwnValues) {
  torch::manual_seed(1);
  const at::Tensor q = (torch::randn({5, 7}) * 40).to(at::kFloat8_e4m3fn);
  const at::Tensor s = torch::rand({3, 2}) + 0.01;  // blocks of 2 x 4: the last row and column blocks short
  const at::Tensor w = models::dequantize_fp8(q, s, {2, 4}, "w");
  EXPECT_EQ(w.scalar_type(), at::kFloat);
  EXPECT_TRUE(torch::equal(w, by_hand(q, s, 2, 4)));
  // A stack (experts): each slice with its own scales.
  const at::Tensor qs = torch::stack({q, q.to(torch::kFloat).neg().to(at::kFloat8_e4m3fn)}), ss = torch::stack({s, s * 3});
  const at::Tensor ws = models::dequantize_fp8(qs, ss, {2, 4}, "w");
  for (int64_t e = 0; e < 2; ++e) EXPECT_TRUE(torch::equal(ws[e], by_hand(qs[e], ss[e], 2, 4))) << e;
  // One scale for the tensor; UE8M0 exponents as bytes; scales in bfloat16.
  EXPECT_TRUE(torch::equal(models::dequantize_fp8(q, torch::full({1}, 0.25), {}, "w"), q.to(torch::kFloat) * 0.25));
  const at::Tensor bytes = torch::tensor({{120, 127}, {128, 130}, {100, 126}}, torch::kByte);
  EXPECT_TRUE(torch::equal(models::dequantize_fp8(q, bytes, {2, 4}, "w"), by_hand(q, torch::exp2(bytes.to(torch::kDouble) - 127), 2, 4)));
  EXPECT_TRUE(torch::equal(models::dequantize_fp8(q, s.to(torch::kBFloat16), {2, 4}, "w"), by_hand(q, s.to(torch::kBFloat16), 2, 4)));
  expect_in(error_of([&] { models::dequantize_fp8(q, torch::ones({2, 2}), {2, 4}, "tensor 'w'"); }),
            "tensor 'w': its scales have shape [2, 2], blocks of 2x4 of [5, 7] make [3, 2]");
  expect_in(error_of([&] { models::dequantize_fp8(q, torch::ones({2}), {}, "tensor 'w'"); }),
            "tensor 'w': its scale has shape [2], one value (weight_block_size is null)");
  expect_in(error_of([&] { models::dequantize_fp8(q, torch::ones({3, 2}, torch::kInt), {2, 4}, "tensor 'w'"); }),
            "tensor 'w': its scales are Int, not floating point or bytes");
}

TEST(HfQuantized, Mxfp4CodesAndScalesDecodeAsTheFormatSays) {
  // Codes 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6; 8..15 the same negated. A byte's low half comes first.
  at::Tensor blocks = torch::full({2, 1, 16}, 0x2A, torch::kByte);  // low 0xA (-1), high 0x2 (1)
  blocks[0][0][0] = 0x71;                                           // low 0x1 (0.5), high 0x7 (6)
  blocks[0][0][1] = 0xF8;                                           // low 0x8 (-0), high 0xF (-6)
  const at::Tensor scales = torch::tensor({{129}, {124}}, torch::kByte);  // 2^2 and 2^-3
  const at::Tensor w = models::dequantize_mxfp4(blocks, scales, "e");
  ASSERT_EQ(w.sizes(), (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(w[0][0].item<float>(), 2.0f);
  EXPECT_EQ(w[0][1].item<float>(), 24.0f);
  EXPECT_EQ(w[0][2].item<float>(), 0.0f);
  EXPECT_TRUE(std::signbit(w[0][2].item<float>()));
  EXPECT_EQ(w[0][3].item<float>(), -24.0f);
  EXPECT_EQ(w[0][4].item<float>(), -4.0f);
  EXPECT_EQ(w[0][5].item<float>(), 4.0f);
  EXPECT_EQ(w[1][30].item<float>(), -0.125f);
  EXPECT_EQ(w[1][31].item<float>(), 0.125f);
  expect_in(error_of([&] { models::dequantize_mxfp4(blocks, torch::ones({2, 2}, torch::kByte), "tensor 'e'"); }),
            "tensor 'e': MXFP4 blocks of shape [2, 1, 16] and scales of shape [2, 2]");
  expect_in(error_of([&] { models::dequantize_mxfp4(blocks.to(torch::kFloat), scales, "tensor 'e'"); }),
            "tensor 'e': MXFP4 blocks and scales are bytes (U8), got Float and Byte");
}

// A Llama checkpoint with every projection in fp8 (blocks of 8 x 16 rows and columns: the MLP's
// 24 columns end in a short block) builds with each weight its dequantized value, exports in
// float32 without the quantization_config, and builds again from that export.
TEST(HfQuantized, AnFp8DirectoryReadsDequantizedAndExportsInFloat) {
  const std::string dir = test::hf_write_model(root() + "/fp8", kLlama);
  nlohmann::json config = kLlama;
  config["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {8, 16}}};
  std::ofstream(dir + "/config.json") << config.dump(2);
  models::SafetensorsCheckpoint plain(dir);
  models::NamedTensors quantized;
  std::map<std::string, at::Tensor> expected;  // by the checkpoint's name
  torch::manual_seed(2);
  for (const std::string& n : plain.names()) {
    const at::Tensor w = plain.get(n).clone();
    if (n.size() < 11 || n.compare(n.size() - 11, 11, "proj.weight") != 0) {
      quantized.emplace_back(n, w);
      expected[n] = w;
      continue;
    }
    const at::Tensor q = (w * 200).to(at::kFloat8_e4m3fn);
    const at::Tensor s = torch::rand({(w.size(0) + 7) / 8, (w.size(1) + 15) / 16}) * 0.01;
    quantized.emplace_back(n, q);
    quantized.emplace_back(n + "_scale_inv", s);
    expected[n] = by_hand(q, s, 8, 16);
  }
  models::save_safetensors(dir + "/model.safetensors", quantized);
  const models::Model m = test::hf_build(dir, 8);
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  EXPECT_EQ(spec.quantization.method, "fp8");
  EXPECT_EQ(spec.quantization.block, (std::vector<int64_t>{8, 16}));
  std::map<std::string, at::Tensor> params = params_of(m);
  for (const models::HfTensor& t : spec.tensors) EXPECT_TRUE(torch::equal(params.at(t.ours), expected.at(t.theirs))) << t.theirs;
  models::save_hf(dir, params, root() + "/fp8_exported", uint64_t{1} << 30);
  std::ifstream in(root() + "/fp8_exported/config.json");
  const nlohmann::json written = nlohmann::json::parse(in);
  EXPECT_FALSE(written.contains("quantization_config"));
  EXPECT_EQ(written["dtype"], "float32");
  models::SafetensorsCheckpoint exported(root() + "/fp8_exported");
  for (const std::string& n : exported.names()) {
    EXPECT_EQ(exported.get(n).scalar_type(), at::kFloat) << n;
    EXPECT_TRUE(torch::equal(exported.get(n), expected.at(n))) << n;
  }
  const std::map<std::string, at::Tensor> again = params_of(test::hf_build(root() + "/fp8_exported", 8));
  for (const auto& [name, p] : params) EXPECT_TRUE(torch::equal(p, again.at(name))) << name;

  // What does not fit is refused by the tensor's name.
  auto with_tensors = [&](const models::NamedTensors& tensors) {
    models::save_safetensors(dir + "/model.safetensors", tensors);
    return test::hf_error(dir);
  };
  const std::string q0 = "model.layers.0.self_attn.q_proj.weight";
  models::NamedTensors no_scale, bad_grid, extra = quantized;
  for (const auto& t : quantized) {
    if (t.first != q0 + "_scale_inv") no_scale.push_back(t);
    bad_grid.emplace_back(t.first, t.first == q0 + "_scale_inv" ? torch::ones({1, 1}) : t.second);
  }
  extra.emplace_back("model.norm.weight_scale_inv", torch::ones({1, 1}));
  expect_in(with_tensors(no_scale), "tensor '" + q0 + "' is quantized (fp8) and its '" + q0 + "_scale_inv' is missing");
  expect_in(with_tensors(bad_grid), "tensor '" + q0 + "': its scales have shape [1, 1], blocks of 8x16 of [16, 16] make [2, 1]");
  expect_in(with_tensors(extra), "tensor 'model.norm.weight_scale_inv' is not part of a LlamaForCausalLM");
  models::save_safetensors(dir + "/model.safetensors", quantized);
  std::ofstream(dir + "/config.json") << kLlama.dump(2);  // fp8 weights without the config that scales them
  expect_in(test::hf_error(dir), "is Float8_e4m3fn: 8-bit floats need scales, and config.json has no fp8 quantization_config");
  auto refused = [&](const nlohmann::json& q, const std::string& what) {
    nlohmann::json c = kLlama;
    c["quantization_config"] = q;
    std::ofstream(dir + "/config.json") << c.dump(2);
    const std::string error = test::hf_error(dir);
    expect_in(error, what);
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  };
  refused("fp8", "quantization_config must be an object, got \"fp8\"");
  refused(nlohmann::json::object(), "quantization_config.quant_method must name the method (fp8 or mxfp4)");
  for (const char* method : {"gptq", "awq", "bitsandbytes", "compressed-tensors", "fbgemm_fp8"})
    refused({{"quant_method", method}}, std::string("quantization_config.quant_method '") + method +
                                            "' is not supported (fp8 and mxfp4 are read, dequantized; dequantize others to bfloat16 first)");
  refused({{"quant_method", "fp8"}, {"activation_scheme", "static"}},
          "quantization_config.activation_scheme \"static\" is not supported (dynamic: the weights alone are quantized)");
  refused({{"quant_method", "fp8"}, {"fmt", "e5m2"}}, "quantization_config.fmt \"e5m2\" is not supported (e4m3)");
  refused({{"quant_method", "fp8"}, {"weight_block_size", {0, 8}}}, "quantization_config.weight_block_size must be [rows, columns] of positive integers");
  refused({{"quant_method", "fp8"}, {"weight_block_size", "128"}}, "quantization_config.weight_block_size must be [rows, columns]");
  refused({{"quant_method", "fp8"}, {"modules_to_not_convert", "lm_head"}}, "quantization_config.modules_to_not_convert must be a list");
}

// GPT-OSS with its experts in MXFP4, as gpt-oss-20b is published: the stacked experts read as the
// codes and scales say, transposed to transformers' [experts, in, out], and exported so.
TEST(HfQuantized, GptOssMxfp4ExpertsReadDequantizedAndExportInFloat) {
  const nlohmann::json config{{"architectures", {"GptOssForCausalLM"}}, {"model_type", "gpt_oss"}, {"vocab_size", 40},
                              {"hidden_size", 32}, {"intermediate_size", 32}, {"num_hidden_layers", 2},
                              {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 8},
                              {"num_local_experts", 4}, {"num_experts_per_tok", 2}, {"sliding_window", 4},
                              {"layer_types", {"sliding_attention", "full_attention"}}, {"tie_word_embeddings", false}};
  const std::string dir = test::hf_write_model(root() + "/mxfp4", config);
  nlohmann::json quantized_config = config;
  quantized_config["quantization_config"] = {{"quant_method", "mxfp4"}, {"modules_to_not_convert", {"lm_head"}}};
  std::ofstream(dir + "/config.json") << quantized_config.dump(2);
  models::SafetensorsCheckpoint plain(dir);
  models::NamedTensors quantized;
  std::map<std::string, at::Tensor> expected;
  torch::manual_seed(3);
  for (const std::string& n : plain.names()) {
    const at::Tensor w = plain.get(n).clone();
    const bool experts = n.find("mlp.experts.") != std::string::npos && n.find("_bias") == std::string::npos;
    if (!experts) {
      quantized.emplace_back(n, w);
      continue;
    }
    // [experts, in, out] held as [experts, out, in / 32, 16] bytes and [experts, out, in / 32] scales.
    const at::Tensor blocks = torch::randint(0, 256, {w.size(0), w.size(2), w.size(1) / 32, 16}, torch::kByte);
    const at::Tensor scales = torch::randint(120, 130, {w.size(0), w.size(2), w.size(1) / 32}, torch::kByte);
    quantized.emplace_back(n + "_blocks", blocks);
    quantized.emplace_back(n + "_scales", scales);
    expected[n] = models::dequantize_mxfp4(blocks, scales, n).transpose(1, 2);
  }
  ASSERT_EQ(expected.size(), 4u);  // gate_up_proj and down_proj of each layer
  models::save_safetensors(dir + "/model.safetensors", quantized);
  const std::map<std::string, at::Tensor> params = params_of(test::hf_build(dir, 8));
  models::save_hf(dir, params, root() + "/mxfp4_exported", uint64_t{1} << 30);
  models::SafetensorsCheckpoint exported(root() + "/mxfp4_exported");
  for (const auto& [name, w] : expected) EXPECT_TRUE(torch::equal(exported.get(name), w)) << name;
  const std::string e = "model.layers.1.mlp.experts.down_proj";
  auto with_tensors = [&](bool keep_scales, bool flat) {
    models::NamedTensors changed;
    for (const auto& t : quantized) {
      if (t.first == e + "_scales" && !keep_scales) continue;
      changed.emplace_back(t.first, t.first == e + "_blocks" && flat ? t.second.flatten(0, 1) : t.second);
    }
    models::save_safetensors(dir + "/model.safetensors", changed);
    return test::hf_error(dir);
  };
  expect_in(with_tensors(false, false), "tensor '" + e + "_blocks' is quantized (mxfp4) and its '" + e + "_scales' is missing");
  expect_in(with_tensors(true, true), "tensor '" + e + "_blocks' has shape [128, 1, 16] (MXFP4 is read for stacked experts");
}
