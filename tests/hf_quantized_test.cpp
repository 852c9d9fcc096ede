// Quantized checkpoints without transformers (models/hf_quantized.h): fp8 blocks (short last
// blocks included) and MXFP4 codes dequantized against values written out here by the formats'
// rules; a Llama directory quantized to fp8 and a GPT-OSS one with MXFP4 experts read back as
// their dequantized weights and exported in float; what is refused, each in one line naming the
// tensor or the field. compressed-tensors' formats likewise: integers packed into words by hand
// (values straddling words included), each strategy's scales and zero points, NVFP4, the groups
// found by their targets, a Llama directory of two formats read and exported, and what is refused.
// Against transformers' own dequantization: hf_test.cpp (HfParity.*Dequantized, *Compressed*).
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
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
  refused(nlohmann::json::object(), "quantization_config.quant_method must name the method (fp8, mxfp4 or compressed-tensors)");
  for (const char* method : {"gptq", "awq", "bitsandbytes", "fbgemm_fp8"})
    refused({{"quant_method", method}}, std::string("quantization_config.quant_method '") + method +
                                            "' is not supported (fp8, mxfp4 and compressed-tensors are read, dequantized; "
                                            "dequantize others to bfloat16 first)");
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

namespace {

// compressed-tensors' packing written out bit by bit: each row's values (offset by 2^(bits-1))
// one after another from bit 0 of its first int32 word.
at::Tensor pack_by_hand(const at::Tensor& values, int64_t bits) {
  const int64_t rows = values.size(0), cols = values.size(1), words = (cols * bits + 31) / 32;
  std::vector<uint32_t> out(rows * words, 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint32_t v = static_cast<uint32_t>(values[r][c].item<int64_t>() + (int64_t{1} << (bits - 1)));
      for (int64_t b = 0; b < bits; ++b)
        if ((v >> b) & 1u) out[r * words + (c * bits + b) / 32] |= 1u << ((c * bits + b) % 32);
    }
  return torch::from_blob(out.data(), {rows, words}, torch::kInt).clone();
}

models::HfCompressedGroup group(const std::string& format, const std::string& strategy, int64_t bits = 8, const std::string& type = "int") {
  models::HfCompressedGroup g;
  g.name = "group_0";
  g.targets = {"Linear"};
  g.format = format;
  g.strategy = strategy;
  g.bits = bits;
  g.type = type;
  return g;
}

}  // namespace

TEST(CompressedTensors, PackedIntegersUnpackAsOneStreamARow) {
  torch::manual_seed(4);
  for (int64_t bits : {1, 2, 3, 4, 5, 7, 8})
    for (int64_t cols : {1, 8, 11, 32, 45}) {
      const int64_t half = int64_t{1} << (bits - 1);
      const at::Tensor values = torch::randint(-half, half, {3, cols}, torch::kLong);
      const at::Tensor packed = pack_by_hand(values, bits);
      EXPECT_TRUE(torch::equal(models::unpack_compressed_ints(packed, bits, cols, "w"), values)) << bits << " bits, " << cols;
    }
  const at::Tensor four = torch::tensor({{-8, -1, 0, 7, 1, 2, 3, 4, -2}}, torch::kLong);  // two words, the second holding one value
  const at::Tensor packed = pack_by_hand(four, 4);
  EXPECT_EQ(packed[0][1].item<int32_t>(), 6);  // -2 + 8, alone in the second word
  expect_in(error_of([&] { models::unpack_compressed_ints(packed, 4, 17, "tensor 'w'"); }),
            "tensor 'w': 17 values of 4 bits take 3 words a row, not 2");
  expect_in(error_of([&] { models::unpack_compressed_ints(packed.to(torch::kLong), 4, 9, "tensor 'w'"); }),
            "tensor 'w': packed integers are int32 [rows, words], got Long [1, 2]");
}

TEST(CompressedTensors, EachStrategyScalesItsOwnValues) {
  torch::manual_seed(5);
  const at::Tensor q = torch::randint(-128, 128, {4, 8}, torch::kChar);
  const at::Tensor rows = torch::rand({4, 1}) + 0.01, groups = torch::rand({4, 2}) + 0.01, zero = torch::randint(-5, 5, {4, 2}, torch::kChar);
  models::HfCompressedParts p;
  p.weight = q;
  p.scale = rows;
  EXPECT_TRUE(torch::equal(models::dequantize_compressed(group("int-quantized", "channel"), p, "w"), by_hand(q, rows, 1, 8)));
  p.scale = torch::full({1}, 0.5);
  EXPECT_TRUE(torch::equal(models::dequantize_compressed(group("int-quantized", "tensor"), p, "w"), q.to(torch::kFloat) * 0.5));
  // Groups of 4 with zero points: (q - z) * s, the scale's type throughout (bfloat16 here).
  models::HfCompressedGroup g = group("int-quantized", "group");
  g.group_size = 4;
  g.symmetric = false;
  p.scale = groups.to(torch::kBFloat16);
  p.zero_point = zero;
  const at::Tensor w = models::dequantize_compressed(g, p, "w");
  EXPECT_EQ(w.scalar_type(), at::kBFloat16);
  const at::Tensor shifted = q.to(torch::kLong) - zero.to(torch::kLong).repeat_interleave(4, 1);
  EXPECT_TRUE(torch::equal(w, by_hand(shifted, p.scale, 1, 4).to(torch::kBFloat16)));
  // The same as pack-quantized 4-bit codes, the zero points packed along the rows.
  const at::Tensor q4 = torch::randint(-8, 8, {4, 8}, torch::kLong);
  const at::Tensor z4 = torch::randint(-8, 8, {4, 2}, torch::kLong);
  models::HfCompressedGroup g4 = g;
  g4.format = "pack-quantized";
  g4.bits = 4;
  models::HfCompressedParts pk;
  pk.packed = pack_by_hand(q4, 4);
  pk.shape = torch::tensor({4, 8}, torch::kLong);
  pk.scale = groups;
  pk.zero_point = pack_by_hand(z4.t().contiguous(), 4).t().contiguous();  // [1 word, 2 groups]
  EXPECT_TRUE(torch::equal(models::dequantize_compressed(g4, pk, "w"), by_hand(q4 - z4.repeat_interleave(4, 1), groups, 1, 4)));
  // fp8 by blocks of 2 x 4 of a [5, 7] weight: the last blocks short.
  models::HfCompressedGroup gb = group("float-quantized", "block", 8, "float");
  gb.block = {2, 4};
  models::HfCompressedParts pb;
  pb.weight = (torch::randn({5, 7}) * 40).to(at::kFloat8_e4m3fn);
  pb.scale = torch::rand({3, 2}) + 0.01;
  EXPECT_TRUE(torch::equal(models::dequantize_compressed(gb, pb, "w"), by_hand(pb.weight, pb.scale, 2, 4)));
  // NVFP4: e2m1 codes (low half first) times float8 scale / global scale in float32, rounded to bfloat16.
  models::HfCompressedGroup gn = group("nvfp4-pack-quantized", "tensor_group", 4, "float");
  gn.group_size = 16;
  models::HfCompressedParts pn;
  pn.packed = torch::randint(0, 256, {2, 16}, torch::kByte);
  pn.scale = (torch::rand({2, 2}) * 400).to(at::kFloat8_e4m3fn);
  pn.global_scale = torch::full({1}, 3.0f);
  const at::Tensor wn = models::dequantize_compressed(gn, pn, "w");
  ASSERT_EQ(wn.sizes(), (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(wn.scalar_type(), at::kBFloat16);
  static const float kFp4[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < 32; ++c) {
      const int byte = pn.packed[r][c / 2].item<int>(), code = c % 2 == 0 ? byte & 15 : byte >> 4;
      const float s = pn.scale[r][c / 16].to(torch::kFloat).item<float>() / 3.0f;
      const float expected = c10::BFloat16(kFp4[code] * s);
      ASSERT_EQ(wn[r][c].item<float>(), expected) << r << " " << c;
    }
  // What does not fit.
  p.zero_point = at::Tensor();
  expect_in(error_of([&] { models::dequantize_compressed(group("int-quantized", "channel"), p, "tensor 'w'"); }),
            "tensor 'w': its scales have shape [4, 2]; the strategy channel of a [4, 8] weight makes [4, 1]");
  g.group_size = 3;
  expect_in(error_of([&] { models::dequantize_compressed(g, p, "tensor 'w'"); }), "tensor 'w': 8 columns are not groups of 3");
  expect_in(error_of([&] { models::dequantize_compressed(gb, p, "tensor 'w'"); }),
            "tensor 'w': float-quantized of 8-bit floats stores them in float8 matrices, got Char [4, 8]");
  pk.shape = torch::tensor({5, 8}, torch::kLong);
  expect_in(error_of([&] { models::dequantize_compressed(g4, pk, "tensor 'w'"); }), "tensor 'w': 4 packed rows, weight_shape says 5");
}

TEST(CompressedTensors, GroupsFoundByNameByPatternOrAsLinear) {
  models::HfQuantization q;
  q.method = "compressed-tensors";
  q.groups = {group("int-quantized", "channel"), group("pack-quantized", "group", 4), group("float-quantized", "channel", 8, "float")};
  q.groups[0].name = "attention";
  q.groups[0].targets = {"re:.*self_attn\\.(q|k|v)_proj$"};
  q.groups[1].name = "mlp";
  q.groups[1].targets = {"Linear"};
  q.groups[2].name = "one";
  q.groups[2].targets = {"model.layers.1.self_attn.o_proj"};
  EXPECT_EQ(models::compressed_group(q, "model.layers.0.self_attn.k_proj", "w").name, "attention");
  EXPECT_EQ(models::compressed_group(q, "model.layers.0.self_attn.o_proj", "w").name, "mlp");
  EXPECT_EQ(models::compressed_group(q, "model.layers.1.self_attn.o_proj", "w").name, "one");
  EXPECT_EQ(models::compressed_group(q, "model.layers.0.mlp.down_proj", "w").name, "mlp");
  q.groups[2].targets = {"re:model\\.layers\\.0\\."};  // from the name's start, as re.match
  expect_in(error_of([&] { models::compressed_group(q, "model.layers.0.self_attn.k_proj", "tensor 'w'"); }),
            "tensor 'w': the groups attention and one of quantization_config.config_groups both target 'model.layers.0.self_attn.k_proj'");
  EXPECT_EQ(models::compressed_group(q, "x.model.layers.0.self_attn.o_proj", "w").name, "mlp");
  q.groups.erase(q.groups.begin() + 1);
  expect_in(error_of([&] { models::compressed_group(q, "model.layers.1.mlp.up_proj", "tensor 'w'"); }),
            "tensor 'w' is quantized, and no group of quantization_config.config_groups targets 'model.layers.1.mlp.up_proj'");
}

// A Llama checkpoint as llm-compressor writes a mixed one: the attention's q, k and v in int8 by
// rows (a pattern's group, with static input scales and the kv cache's scales beside, which are not
// read), every other projection 4-bit packed by groups of 8 with zero points; it builds with each
// weight its dequantized value and exports in float32 without the quantization_config.
TEST(CompressedTensors, AMixedDirectoryReadsDequantizedAndRefusesWhatDoesNotFit) {
  const std::string dir = test::hf_write_model(root() + "/compressed", kLlama);
  const nlohmann::json attention{{"targets", {"re:.*self_attn\\.[qkv]_proj$"}}, {"format", "int-quantized"},
                                 {"weights", {{"num_bits", 8}, {"type", "int"}, {"strategy", "channel"}, {"symmetric", true}, {"dynamic", false}}},
                                 {"input_activations", {{"num_bits", 8}, {"type", "int"}, {"strategy", "tensor"}, {"dynamic", false}}}};
  const nlohmann::json rest{{"targets", {"Linear"}}, {"format", "pack-quantized"},
                            {"weights", {{"num_bits", 4}, {"type", "int"}, {"strategy", "group"}, {"group_size", 8}, {"symmetric", false}}}};
  const nlohmann::json qc{{"quant_method", "compressed-tensors"}, {"format", "mixed-precision"}, {"quantization_status", "compressed"},
                          {"config_groups", {{"attention", attention}, {"rest", rest}}}, {"ignore", {"lm_head"}},
                          {"kv_cache_scheme", {{"num_bits", 8}, {"type", "float"}}}};
  nlohmann::json config = kLlama;
  config["quantization_config"] = qc;
  std::ofstream(dir + "/config.json") << config.dump(2);
  models::SafetensorsCheckpoint plain(dir);
  models::NamedTensors stored;
  std::map<std::string, at::Tensor> expected;
  torch::manual_seed(6);
  for (const std::string& n : plain.names()) {
    const at::Tensor w = plain.get(n).clone();
    expected[n] = w;
    if (n.size() < 11 || n.compare(n.size() - 11, 11, "proj.weight") != 0) {
      stored.emplace_back(n, w);
      continue;
    }
    const std::string module = n.substr(0, n.size() - 7);
    if (n.find("self_attn.o_proj") == std::string::npos && n.find("self_attn") != std::string::npos) {
      const at::Tensor q = torch::randint(-128, 128, w.sizes(), torch::kChar), s = torch::rand({w.size(0), 1}) * 0.01;
      stored.emplace_back(n, q);
      stored.emplace_back(n + "_scale", s);
      stored.emplace_back(module + ".input_scale", torch::ones({1}));
      expected[n] = by_hand(q, s, 1, w.size(1));
    } else {
      const at::Tensor q = torch::randint(-8, 8, w.sizes(), torch::kLong), z = torch::randint(-8, 8, {w.size(0), w.size(1) / 8}, torch::kLong);
      const at::Tensor s = torch::rand({w.size(0), w.size(1) / 8}) * 0.01;
      stored.emplace_back(n + "_packed", pack_by_hand(q, 4));
      stored.emplace_back(n + "_shape", torch::tensor(w.sizes().vec(), torch::kLong));
      stored.emplace_back(n + "_scale", s);
      stored.emplace_back(n + "_zero_point", pack_by_hand(z.t().contiguous(), 4).t().contiguous());
      expected[n] = by_hand(q - z.repeat_interleave(8, 1), s, 1, 8);
    }
    if (n.find("self_attn.k_proj") != std::string::npos) {
      const std::string attn = n.substr(0, n.find("k_proj"));
      stored.emplace_back(attn + "k_scale", torch::ones({1}));
      stored.emplace_back(attn + "v_scale", torch::ones({1}));
    }
  }
  models::save_safetensors(dir + "/model.safetensors", stored);
  const models::HfSpec spec = models::read_hf_spec(dir, 8, "test");
  ASSERT_EQ(spec.quantization.groups.size(), 2u);
  const std::map<std::string, at::Tensor> params = params_of(test::hf_build(dir, 8));
  for (const models::HfTensor& t : spec.tensors) EXPECT_TRUE(torch::equal(params.at(t.ours), expected.at(t.theirs))) << t.theirs;
  models::save_hf(dir, params, root() + "/compressed_exported", uint64_t{1} << 30);
  std::ifstream in(root() + "/compressed_exported/config.json");
  EXPECT_FALSE(nlohmann::json::parse(in).contains("quantization_config"));
  models::SafetensorsCheckpoint exported(root() + "/compressed_exported");
  for (const std::string& n : exported.names()) EXPECT_TRUE(torch::equal(exported.get(n), expected.at(n))) << n;

  // Tensors that do not fit, by name.
  auto without = [&](const std::string& name, const std::string& extra = "") {
    models::NamedTensors changed;
    for (const auto& t : stored)
      if (t.first != name) changed.push_back(t);
    if (!extra.empty()) changed.emplace_back(extra, torch::zeros({4}, torch::kInt));
    models::save_safetensors(dir + "/model.safetensors", changed);
    return test::hf_error(dir);
  };
  const std::string up = "model.layers.0.mlp.up_proj.weight", q0 = "model.layers.0.self_attn.q_proj.weight";
  expect_in(without(up + "_shape"), "tensor '" + up + "_packed' is quantized (pack-quantized, group rest) and its '" + up + "_shape' is missing");
  expect_in(without(up + "_zero_point"), "its '" + up + "_zero_point' is missing");
  expect_in(without(q0 + "_scale"), "tensor '" + q0 + "' is Char, not floating point");
  expect_in(without("", up + "_g_idx"), "its activation-order indices ('" + up + "_g_idx') are not read");
  models::save_safetensors(dir + "/model.safetensors", stored);
  // Configurations that are not read, by field.
  auto refused = [&](const std::function<void(nlohmann::json&)>& change, const std::string& what) {
    nlohmann::json c = config;
    change(c["quantization_config"]);
    std::ofstream(dir + "/config.json") << c.dump(2);
    const std::string error = test::hf_error(dir);
    expect_in(error, what);
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  };
  const std::string at = "quantization_config.config_groups.rest.";
  refused([](nlohmann::json& q) { q["quantization_status"] = "frozen"; }, "quantization_config.quantization_status \"frozen\" is not read");
  refused([](nlohmann::json& q) { q["sparsity_config"] = {{"format", "sparse-24-bitmask"}}; }, "quantization_config.sparsity_config is not read");
  refused([](nlohmann::json& q) { q["transform_config"] = {{"config_groups", {{"u", 1}}}}; }, "quantization_config.transform_config is not read");
  refused([](nlohmann::json& q) { q.erase("config_groups"); }, "quantization_config.config_groups must name the groups");
  refused([](nlohmann::json& q) { q["config_groups"]["rest"]["format"] = "marlin-24"; }, at + "format 'marlin-24' is not read");
  refused([](nlohmann::json& q) { q["config_groups"]["rest"].erase("targets"); }, at + "targets must be a list");
  refused([](nlohmann::json& q) { q["config_groups"]["rest"]["weights"]["num_bits"] = 16; }, at + "weights.num_bits must be an integer from 1 to 8");
  refused([](nlohmann::json& q) { q["config_groups"]["rest"]["weights"]["type"] = "float"; }, at + "weights.type must be \"int\" for pack-quantized");
  refused([](nlohmann::json& q) { q["config_groups"]["rest"]["weights"].erase("group_size"); }, at + "weights.group_size is needed by the strategy group");
  refused([](nlohmann::json& q) { q["config_groups"]["rest"]["weights"]["dynamic"] = true; }, at + "weights.dynamic true is not a stored quantization");
  refused([](nlohmann::json& q) { q["config_groups"]["rest"]["weights"]["strategy"] = "token"; }, at + "weights.strategy 'token' is not read");
  refused([](nlohmann::json& q) { q["config_groups"]["attention"]["weights"]["num_bits"] = 4; },
          "quantization_config.config_groups.attention.weights.num_bits 4-bit ints are not what int-quantized stores");
  refused([](nlohmann::json& q) { q["config_groups"]["rest"] = {{"targets", {"Linear"}}, {"format", "nvfp4-pack-quantized"},
                                                                 {"weights", {{"num_bits", 4}, {"type", "float"}, {"group_size", 32}}}}; },
          at + "weights must be symmetric 4-bit floats by groups of 16 for nvfp4-pack-quantized");
  refused([](nlohmann::json& q) { q["format"] = "mixed-precision"; q["config_groups"]["rest"].erase("format"); }, at + "format 'mixed-precision' is not read");
}
