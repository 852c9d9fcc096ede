// The hf family against transformers itself (tests/hf_models.py makes the models and computes
// transformers' results): for each architecture, in float32, float64 and bfloat16 (the model
// from_pretrained loads in bfloat16; its steps on one micro-batch), the logits of a pipeline
// of 1 and 3 stages equal transformers' (1e-5; 5e-5 where transformers fuses products we keep
// apart: Phi-3, the experts of Mixtral and Qwen3-MoE; 1e-10 in float64; bfloat16 below); 5 steps of
// plain SGD on one batch on 3 stages give transformers' losses, and the weights written by
// save_hf, loaded with from_pretrained, equal transformers' trained weights. Each case prints its
// largest differences ("parity ..." lines: the table of docs/models.md). Skipped where the
// project's Python has no transformers (scripts/setup.sh installs it). The family's checks that need
// no transformers: hf_family_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/error.h"
#include "job/npy.h"
#include "models/families.h"
#include "models/hf.h"
#include "models/model.h"
#include "pipeline/pipeline.h"
#include "tests/hf_oracle.h"
#include "tests/process_helpers.h"

using namespace pipetrain;

namespace {

using test::has_transformers;
using test::python;

std::string root() { return test::scratch_dir("hf"); }

at::Tensor load_npy(const std::string& file) {
  const job::NpyHeader h = job::read_npy_header(file);
  const at::ScalarType type = h.descr == "'<i8'" ? at::kLong : h.descr == "'<f8'" ? at::kDouble : at::kFloat;
  return job::map_file(file, h.offset, h.shape, type).clone();
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

at::Tensor ce(const at::Tensor& out, const at::Tensor& target) {
  return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), target.reshape({-1}));
}
// Nemotron-H's transformers model casts its logits to float32 (.float()), so the oracle's loss is
// taken on float32 logits in lower precisions: here too.
at::Tensor ce_float32(const at::Tensor& out, const at::Tensor& target) {
  return ce(c10::isReducedFloatingType(out.scalar_type()) ? out.to(torch::kFloat) : out, target);
}
bool float32_logits(const std::string& arch) { return arch.rfind("nemotron-h", 0) == 0; }

// A "-grouped" case's experts as grouped GEMMs (against transformers' grouped_mm experts).
models::Model build(const std::string& arch, const std::string& dir, int64_t seq_len) {
  const bool grouped = arch.size() > 8 && arch.compare(arch.size() - 8, 8, "-grouped") == 0;
  return test::hf_build(dir, seq_len, grouped ? nlohmann::json{{"experts_kernel", "grouped"}} : nlohmann::json::object());
}

pipeline::PipelineOptions options(const models::Model& m, int stages) {
  pipeline::PipelineOptions o;
  o.stages = stages;
  o.micro_batches = 2;
  o.ties = m.ties;
  return o;
}

// float32's bound. Phi-3's q, k and v come from one fused matrix product in transformers and from
// three here (gate and up from one and two; the experts' gate and up of Mixtral, Qwen3-MoE,
// GraniteMoE, DeepSeek-V3, GLM-4.5, Llama 4 and Nemotron-H likewise): the sums round apart in float32's last bits from the first logits on (2.9e-6 here),
// which 5 SGD steps of lr 0.1 carry into the weights (6.4e-6 here, AMD EPYC; another CPU's
// kernels block the sums otherwise).
bool fused(const std::string& arch) {
  return arch.rfind("phi3", 0) == 0 || arch == "mixtral" || arch == "qwen2-moe" || arch == "qwen3-moe" || arch == "olmoe" ||
         arch.rfind("granitemoe", 0) == 0 || arch.rfind("deepseek", 0) == 0 || arch.rfind("glm4", 0) == 0 || arch.rfind("gpt-oss", 0) == 0 ||
         arch.rfind("llama4", 0) == 0 || arch == "minimax-m2" || arch == "qwen3-next" || arch.rfind("qwen3.5-moe", 0) == 0 ||
         arch == "nemotron-h" || arch == "nemotron-h-latent";
}
double float32_bound(const std::string& arch) { return fused(arch) ? 5e-5 : 1e-5; }
// bfloat16's bound on the logits (of at most 4 in magnitude here): one bfloat16 step in [2, 4),
// four where the products are fused apart. Measured: 0 for every case (AMD EPYC); OLMo 2's
// rotation in bfloat16 instead of float32 is 0.045 away, GPT-2's fused GELU for gelu_new 0.031.
double bfloat16_bound(const std::string& arch) { return fused(arch) ? 1.0 / 16 : 1.0 / 64; }
// bfloat16 training (5 SGD steps of lr 0.1 on one micro-batch, the model in bfloat16): the losses
// within two bfloat16 steps at 4 (1/16), the trained weights (below 1) within 1/32; where
// products are fused apart, whose backward rounds twice in bfloat16 where transformers rounds once
// (the gradient of a fused matrix's input: two products each rounded, then added), and which the
// next steps carry on, 1/4 and 1/8. Measured (AMD EPYC): 0 and 0 in 27 of the 61 cases (windowed
// attention among them: its masked path repeats key and value heads as transformers does); where
// nothing is fused apart, GPT-2's attention alone rounds otherwise (0 and 0.0078); fused apart (the
// experts' sums too), at most 0.156 and 0.061 (GPT-OSS with MXFP4 experts; unquantized 0.109, its
// losses from the third step on, and 0.045, its weights one bfloat16 step apart in most tensors).
double bfloat16_loss_bound(const std::string& arch) { return fused(arch) ? 1.0 / 4 : 1.0 / 16; }
// Qwen3-Next's and Qwen3.5's gated DeltaNet: its L2-normalized keys take large steps in these tiny
// random models (5 SGD steps of lr 0.1 move Qwen3-Next's convolution weights by 1.6), which carry
// float32's last-bit differences (at most 3.3e-6 in the first logits) to at most 1.1e-3 in the
// losses and 2.9e-3 in the weights, and bfloat16's (logits bit for bit) to 0.094 and 0.18
// (Qwen3-Next; dense Qwen3.5's bit for bit) (AMD EPYC); in float64 the same steps agree within
// 8.0e-11 and 5.9e-11 (within 1e-10: the math is the same). Their training bounds: 1e-2 in float32,
// 1/4 for bfloat16's weights.
bool delta_rule(const std::string& arch) { return arch.rfind("qwen3-next", 0) == 0 || arch.rfind("qwen3.5", 0) == 0; }
// Qwen3.5-MoE's bfloat16 steps drift apart (0.23 in the losses, 0.46 in the weights; more as a
// text model alone, another seed) where its bfloat16 logits are bit for bit and its float64 steps
// agree to 1.2e-12 (weights 4.3e-11): its bfloat16 training is printed, not compared.
bool bfloat16_training_compared(const std::string& arch) { return arch.rfind("qwen3.5-moe", 0) != 0; }
// Granite 4.0-H's Mamba 2 layers: the dense case's 5 steps move fast (its loss from 5.6 to 2.8),
// carrying float32's last-bit differences of its fused shared MLP (2.2e-6 in the first logits) to
// 2.5e-5 in the losses and 1.4e-5 in the weights (AMD EPYC), half of the fused bound; another CPU's
// kernels round otherwise, so their float32 training bound is 1e-3 (float64 agrees to 1.3e-15).
bool mamba_hybrid(const std::string& arch) { return arch.rfind("granitemoehybrid", 0) == 0 || arch == "bamba"; }
double float32_training_bound(const std::string& arch) { return delta_rule(arch) ? 1e-2 : mamba_hybrid(arch) ? 1e-3 : float32_bound(arch); }
double bfloat16_weight_bound(const std::string& arch) { return delta_rule(arch) ? 1.0 / 4 : fused(arch) ? 1.0 / 8 : 1.0 / 32; }

// Every check of one architecture, both precisions.
void check_architecture(const std::string& arch) {
  if (!has_transformers()) GTEST_SKIP() << "the project's Python has no transformers (scripts/setup.sh installs it)";
  const auto made = test::shell(python() + " " + test::hf_oracle() + " make " + root() + " " + arch + " 2>&1");
  ASSERT_EQ(made.status, 0) << made.out;
  for (const std::string dtype : {"float32", "float64", "bfloat16"}) {
    const std::string dir = root() + "/" + arch + "-" + dtype;
    const double tol = dtype == "float64" ? 1e-10 : dtype == "bfloat16" ? bfloat16_bound(arch) : float32_bound(arch);
    const at::Tensor tokens = load_npy(dir + "/tokens.npy"), expected = load_npy(dir + "/logits.npy");
    const int64_t T = tokens.size(1) - 1;
    const at::Tensor x = tokens.narrow(1, 0, T).contiguous(), y = tokens.narrow(1, 1, T).contiguous();
    for (int stages : {1, 3}) {
      models::Model m = build(arch, dir + "/model", T);
      ASSERT_EQ(m.layers->parameters()[0].scalar_type(), dtype == "float64" ? at::kDouble : at::kFloat);
      if (dtype == "bfloat16") m.layers->to(torch::kBFloat16);
      pipeline::Pipeline pipe(m.layers, options(m, stages), ce);
      const at::Tensor logits = pipe.predict(x);
      const double d = max_diff(logits, expected);
      std::printf("parity %s %s stages=%d logits=%.3g\n", arch.c_str(), dtype.c_str(), stages, d);
      EXPECT_LE(d, tol) << arch << " " << dtype << " on " << stages << " stages";
    }
    // Training: 5 SGD steps on one batch, 3 stages, then the weights exported.
    models::Model m = build(arch, dir + "/model", T);
    pipeline::PipelineOptions o = options(m, 3);
    if (dtype == "bfloat16") {
      m.layers->to(torch::kBFloat16);
      o.micro_batches = 1;
    }
    pipeline::Pipeline pipe(m.layers, o, float32_logits(arch) ? ce_float32 : ce);
    pipe.optimizers().set([](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.1); });
    const at::Tensor losses = load_npy(dir + "/losses.npy");
    double worst = 0;
    for (int64_t s = 0; s < losses.size(0); ++s) {
      const double loss = pipe.train_step(x, y);
      worst = std::max(worst, std::abs(loss - losses[s].item<double>()));
    }
    std::printf("parity %s %s stages=3 sgd5-loss=%.3g\n", arch.c_str(), dtype.c_str(), worst);
    if (dtype != "bfloat16" || bfloat16_training_compared(arch))
      EXPECT_LE(worst, dtype == "float64" ? 1e-10 : dtype == "bfloat16" ? bfloat16_loss_bound(arch) : float32_training_bound(arch)) << arch << " " << dtype << " losses";
    std::map<std::string, at::Tensor> weights;
    for (const auto& p : m.layers->named_parameters()) weights[p.key()] = p.value();
    for (const auto& b : m.layers->named_buffers()) weights[b.key()] = b.value();  // DeepSeek-V3's router's bias
    EXPECT_GT(models::save_hf(dir + "/model", weights, dir + "/exported", 1 << 20), 0u);
  }
  const auto compared = test::shell(python() + " " + test::hf_oracle() + " compare " + root() + " 2>/dev/null");
  ASSERT_EQ(compared.status, 0) << compared.out;
  const nlohmann::json result = nlohmann::json::parse(compared.out.substr(compared.out.find('{')));
  for (const std::string dtype : {"float32", "float64", "bfloat16"}) {
    const std::string name = arch + "-" + dtype;
    ASSERT_TRUE(result.contains(name) && result[name].is_number()) << compared.out;
    const double d = result[name].get<double>();
    std::printf("parity %s %s exported-vs-trained=%.3g\n", arch.c_str(), dtype.c_str(), d);
    if (dtype != "bfloat16" || bfloat16_training_compared(arch))
      EXPECT_LE(d, dtype == "float64" ? 1e-10 : dtype == "bfloat16" ? bfloat16_weight_bound(arch) : float32_training_bound(arch)) << name;
  }
}

}  // namespace

TEST(HfParity, Llama) { check_architecture("llama"); }
TEST(HfParity, Llama3RopeTiedWithBiases) { check_architecture("llama3-tied"); }
TEST(HfParity, LlamaDynamicRopeWithinItsPositions) { check_architecture("llama-dynamic"); }
TEST(HfParity, LlamaDynamicRopeBeyondItsPositions) { check_architecture("llama-dynamic-long"); }
TEST(HfParity, MistralSlidingWindow) { check_architecture("mistral"); }
TEST(HfParity, Ministral3QueryScaleBeyondItsPositions) { check_architecture("ministral3"); }
TEST(HfParity, Qwen2) { check_architecture("qwen2"); }
TEST(HfParity, Qwen3QkNormHeadDimBiasesTied) { check_architecture("qwen3"); }
TEST(HfParity, Phi3FusedTensorsWindowPadding) { check_architecture("phi3"); }
TEST(HfParity, Qwen3YarnRope) { check_architecture("qwen3-yarn"); }
TEST(HfParity, Phi3LongropePartialRotaryTied) { check_architecture("phi3-longrope"); }
TEST(HfParity, Olmo2PostNormsProjectionQkNorms) { check_architecture("olmo2"); }
TEST(HfParity, Olmo3WindowsAndTheFullLayersOwnRope) { check_architecture("olmo3"); }
TEST(HfParity, GemmaScaledEmbeddingGegluPadding) { check_architecture("gemma"); }
TEST(HfParity, Gemma2SandwichNormsSoftcapsWindows) { check_architecture("gemma2"); }
TEST(HfParity, Gemma3QkNormsLocalRope) { check_architecture("gemma3"); }
TEST(HfParity, GraniteMultipliersBiasesTied) { check_architecture("granite"); }
TEST(HfParity, SmolLM3NoPeLayerWindowBiasesTied) { check_architecture("smollm3"); }
TEST(HfParity, MixtralExperts) { check_architecture("mixtral"); }
TEST(HfParity, MixtralGroupedExperts) { check_architecture("mixtral-grouped"); }
TEST(HfParity, Qwen2MoeSharedExpertAndADenseLayer) { check_architecture("qwen2-moe"); }
TEST(HfParity, Qwen3MoeExpertsAndADenseLayer) { check_architecture("qwen3-moe"); }
TEST(HfParity, OlmoeExpertsClippedQkv) { check_architecture("olmoe"); }
TEST(HfParity, GraniteMoeStackedExpertsMultipliersTied) { check_architecture("granitemoe"); }
TEST(HfParity, GraniteMoeSharedExpertWithoutAGate) { check_architecture("granitemoe-shared"); }
TEST(HfParity, DeepseekV3LatentAttentionGroupedSigmoidRouting) { check_architecture("deepseek-v3"); }
TEST(HfParity, DeepseekV3GroupedExperts) { check_architecture("deepseek-v3-grouped"); }
TEST(HfParity, DeepseekV3DirectQueriesHalvesRopeTied) { check_architecture("deepseek-v3-lite"); }
TEST(HfParity, DeepseekV2ComplexRopeGroupLimitedSoftmax) { check_architecture("deepseek-v2"); }
TEST(HfParity, Glm4MoeHalfRotatedQkNormsSigmoidRouting) { check_architecture("glm4-moe"); }
TEST(HfParity, GptOssSinksClampedSwigluStackedExperts) { check_architecture("gpt-oss"); }
TEST(HfParity, GptOssGroupedExperts) { check_architecture("gpt-oss-grouped"); }
TEST(HfParity, Llama4ChunksNoPeTemperatureInputScaledExperts) { check_architecture("llama4"); }
TEST(HfParity, Llama4TopTwoExpertsNoPeMiddleLayerBiasesTied) { check_architecture("llama4-top2"); }
TEST(HfParity, Llama4LanguageModelBesideItsVisionModel) { check_architecture("llama4-vision"); }
TEST(HfParity, Glm4SandwichNormsInterleavedHalfRotationFusedMlp) { check_architecture("glm4"); }
TEST(HfParity, Ernie45InterleavedRotationInFloat32BiasesTied) { check_architecture("ernie4_5"); }
TEST(HfParity, Exaone4PostNormsQkNormsWindowsNoPeFullLayers) { check_architecture("exaone4"); }
TEST(HfParity, MiniMaxM2ProjectionQkNormsPartialRopeSigmoidExperts) { check_architecture("minimax-m2"); }
TEST(HfParity, ArceeReluSquaredMlpWithoutAGateYarnBiases) { check_architecture("arcee"); }
TEST(HfParity, ApertusXieluMlpQkNormsLlama3RopePadding) { check_architecture("apertus"); }
TEST(HfParity, HunyuanQkNormsAfterTheRotationAlphaRopeTied) { check_architecture("hunyuan"); }
TEST(HfParity, Qwen3NextGatedDeltaNetGatedAttentionSharedExpert) { check_architecture("qwen3-next"); }
TEST(HfParity, Qwen35SplitDeltaNetProjectionsTied) { check_architecture("qwen3.5"); }
TEST(HfParity, Qwen35MoeLanguageModelBesideItsVisionModelTied) { check_architecture("qwen3.5-moe-vision"); }
TEST(HfParity, Gemma3BesideItsVisionTowerTiedWindowsTwoRopes) { check_architecture("gemma3-vision"); }
TEST(HfParity, Mistral3BesideItsVisionTowerUntiedWindow) { check_architecture("mistral3-vision"); }
TEST(HfParity, LlavaMistralBesideItsVisionTowerUntied) { check_architecture("llava"); }
TEST(HfParity, InternVlQwen2BesideItsVisionTowerTied) { check_architecture("internvl"); }
TEST(HfParity, AyaVisionCohere2BesideItsVisionTowerLogitsUnscaled) { check_architecture("aya-vision"); }
TEST(HfParity, Qwen3VlLanguageModelBesideItsVisionModelTied) { check_architecture("qwen3-vl"); }
TEST(HfParity, Qwen3VlMoeStackedExpertsBesideItsVisionModel) { check_architecture("qwen3-vl-moe"); }
TEST(HfParity, Qwen25VlLanguageModelBesideItsVisionModelWindows) { check_architecture("qwen2.5-vl"); }
TEST(HfParity, GraniteMoeHybridMamba2LayersAroundNoPeAttentionExperts) { check_architecture("granitemoehybrid"); }
TEST(HfParity, GraniteMoeHybridDenseMamba2ShortChunksRopeTied) { check_architecture("granitemoehybrid-dense"); }
TEST(HfParity, CohereParallelCenteredNormsInterleavedRotationLogitScaleTied) { check_architecture("cohere"); }
TEST(HfParity, CohereQkNormsOfEachHeadItsOwnWeights) { check_architecture("cohere-qk"); }
TEST(HfParity, Starcoder2LayerNormsGeluMlpBiasesWindowTied) { check_architecture("starcoder2"); }
TEST(HfParity, SeedOssAttentionBiasesInAndOutPadding) { check_architecture("seed-oss"); }
TEST(HfParity, GptNeoXFusedHeadsQuarterRotatedParallelTwoNorms) { check_architecture("gpt-neox"); }
TEST(HfParity, GptNeoXSequentialNoAttentionBiasesFastGeluTied) { check_architecture("gpt-neox-sequential"); }
TEST(HfParity, PhiParallelOneNormGeluNewHeadBiasPadding) { check_architecture("phi"); }
TEST(HfParity, PhiQkLayerNormsGroupedHeadsExactGelu) { check_architecture("phi-qk"); }
TEST(HfParity, StableLmLayerNormsQuarterRotatedQkvBiases) { check_architecture("stablelm"); }
TEST(HfParity, StableLmParallelQkNormsOfEachHead) { check_architecture("stablelm-parallel-qk"); }
TEST(HfParity, FalconMultiQueryParallelOneNormTied) { check_architecture("falcon"); }
TEST(HfParity, Falcon40bGroupedFusedHeadsTwoNorms) { check_architecture("falcon-40b"); }
TEST(HfParity, FalconSequentialHeadByHeadGeluNewBiases) { check_architecture("falcon-sequential"); }
TEST(HfParity, GptJParallelInterleavedPartialRotationBiases) { check_architecture("gptj"); }
TEST(HfParity, GptBigCodeMultiQueryLearnedPositionsTied) { check_architecture("gpt-bigcode"); }
TEST(HfParity, GptBigCodeHeadByHeadGeluNewUntied) { check_architecture("gpt-bigcode-mha"); }
TEST(HfParity, OlmoLayerNormsWithoutParametersClippedQkv) { check_architecture("olmo"); }
TEST(HfParity, Cohere2WindowsRotatingFullLayerWithoutPositions) { check_architecture("cohere2"); }
TEST(HfParity, BambaMamba2AroundHalfRotatedAttentionStepsClampedBiasesTied) { check_architecture("bamba"); }
TEST(HfParity, NemotronHBlocksOfOnePartMamba2AttentionReluSquaredExperts) { check_architecture("nemotron-h"); }
TEST(HfParity, NemotronHDenseShortChunksProjectionBiasesStepFloor) { check_architecture("nemotron-h-dense"); }
TEST(HfParity, NemotronHLatentExperts) { check_architecture("nemotron-h-latent"); }
TEST(HfParity, Qwen3Fp8BlocksDequantized) { check_architecture("qwen3-fp8"); }
TEST(HfParity, DeepseekV3Fp8BlocksDequantized) { check_architecture("deepseek-v3-fp8"); }
TEST(HfParity, GptOssMxfp4ExpertsDequantized) { check_architecture("gpt-oss-mxfp4"); }
TEST(HfParity, LlamaCompressedW4A16AsymmetricGroupsPacked) { check_architecture("llama-w4a16-asymmetric"); }
TEST(HfParity, Phi3CompressedW8A8Int8ByRowsFused) { check_architecture("phi3-w8a8-int8"); }
TEST(HfParity, Qwen3CompressedFp8BlocksStaticScalesNotRead) { check_architecture("qwen3-fp8-blocks-static"); }
TEST(HfParity, MistralCompressedNvfp4GlobalScale) { check_architecture("mistral-nvfp4"); }
TEST(HfParity, Gpt2) { check_architecture("gpt2"); }
