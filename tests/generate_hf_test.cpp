// Generation with a key/value cache (models/generate.h, models/incremental.h): a layer list run on
// the next positions alone equals the whole window; cached generation equals the window re-run
// token for token on the hf family's models, beyond the window too; greedy generation equals
// transformers' own model.generate (tests/hf_models.py makes the models with transformers; one test
// per group of families, so that each stays well within its time limit); and
// `pipetrain generate` with token ids on an hf model (made here, without Python). The cases that
// need transformers are skipped where the project's Python has none (scripts/setup.sh installs it).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/generate.h"
#include "models/hf.h"
#include "models/incremental.h"
#include "models/model.h"
#include "models/skip.h"
#include "tests/cli_helpers.h"
#include "tests/hf_oracle.h"

using namespace pipetrain;
using json = nlohmann::json;

namespace {

using test::has_transformers;
using test::hf_oracle;
using test::python;

std::string scratch() { return test::scratch_dir("generate_hf"); }

models::Model build(json model, uint64_t seed = 3) {
  JsonReader r(model, "model", "test");
  return models::build(r, seed);
}

models::Model layer_list(const json& layers, int64_t seq_len) {
  models::Model m =
      build({{"family", "layers"}, {"input_shape", {seq_len}}, {"input_dtype", "long"}, {"layers", layers}});
  m.layers->to(torch::kDouble);
  return m;
}

// Llama-family blocks (one with a sliding window) between position-wise layers, a skip among them.
json llama_layers() {
  return json::array({
      {{"name", "embed"}, {"type", "embedding"}, {"num_embeddings", 50}, {"embedding_dim", 16}},
      {{"name", "layer_0"},
       {"type", "llama_block"},
       {"d_model", 16},
       {"n_heads", 4},
       {"n_kv_heads", 2},
       {"d_ff", 24}},
      {{"name", "layer_1"},
       {"type", "llama_block"},
       {"d_model", 16},
       {"n_heads", 4},
       {"d_ff", 24},
       {"sliding_window", 3},
       {"stash", "r"}},
      {{"name", "act"}, {"type", "silu"}},
      {{"name", "mlp"}, {"type", "mlp_block"}, {"d_model", 16}, {"d_ff", 20}},
      {{"name", "res"}, {"type", "add"}, {"from", "r"}},
      {{"name", "norm"}, {"type", "rmsnorm"}, {"normalized_shape", 16}},
      {{"name", "lm_head"}, {"type", "linear"}, {"in_features", 16}, {"out_features", 50}, {"bias", false}},
  });
}

// GPT-2's shape: learned positions (with dropout, off in evaluation), gpt2_block, layernorm.
json gpt2_layers() {
  return json::array({
      {{"name", "embed"},
       {"type", "embedding"},
       {"num_embeddings", 40},
       {"embedding_dim", 16},
       {"max_positions", 24},
       {"dropout", 0.2}},
      {{"name", "h_0"}, {"type", "gpt2_block"}, {"d_model", 16}, {"n_heads", 2}, {"dropout", 0.1}},
      {{"name", "h_1"}, {"type", "gpt2_block"}, {"d_model", 16}, {"n_heads", 2}},
      {{"name", "drop"}, {"type", "dropout"}, {"p", 0.3}},
      {{"name", "ln_f"}, {"type", "layernorm"}, {"normalized_shape", 16}},
      {{"name", "id"}, {"type", "identity"}},
      {{"name", "lm_head"}, {"type", "linear"}, {"in_features", 16}, {"out_features", 40}},
  });
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// The list run on `tokens` a chunk of positions at a time through each layer's forward_at.
at::Tensor run_in_chunks(torch::nn::Sequential& model, const at::Tensor& tokens,
                         const std::vector<int64_t>& chunks) {
  std::vector<models::IncrementalLayer*> layers;
  for (const auto& l : model->children()) layers.push_back(dynamic_cast<models::IncrementalLayer*>(l.get()));
  std::vector<models::KvCache> caches(layers.size());
  std::vector<at::Tensor> outs;
  int64_t offset = 0;
  for (int64_t n : chunks) {
    models::TensorSkipScope scope;
    at::Tensor x = tokens.narrow(1, offset, n);
    for (size_t i = 0; i < layers.size(); ++i) x = layers[i]->forward_at(x, offset, caches[i]);
    outs.push_back(x);
    offset += n;
  }
  return torch::cat(outs, 1);
}

models::GenerateOptions greedy(int64_t new_tokens, int64_t seq_len, bool cache) {
  models::GenerateOptions o;
  o.new_tokens = new_tokens;
  o.seq_len = seq_len;
  o.temperature = 0;
  o.cache = cache;
  return o;
}

std::string ids_text(const std::vector<int64_t>& ids) {
  std::string s;
  for (int64_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

}  // namespace

TEST(IncrementalLayers, ChunksOfPositionsEqualTheWholeWindow) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, layers] :
       {std::pair<std::string, json>{"llama", llama_layers()}, {"gpt2", gpt2_layers()}}) {
    models::Model m = layer_list(layers, 12);
    m.layers->eval();
    ASSERT_TRUE(models::generates_incrementally(m.layers)) << name;
    const at::Tensor tokens = torch::randint(0, 40, {2, 12}, torch::kLong);
    const at::Tensor whole = models::forward_with_skips(m.layers, tokens);
    for (const std::vector<int64_t>& chunks :
         {std::vector<int64_t>{12}, {5, 1, 1, 3, 2}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}}) {
      const double d = max_diff(run_in_chunks(m.layers, tokens, chunks), whole);
      EXPECT_LE(d, 1e-10) << name << " in " << chunks.size() << " chunks";
    }
  }
}

// A windowed layer's cache keeps only the window's last window - 1 positions, a chunked one
// (Llama 4's) those of its current chunk; fed in chunks of positions, the outputs equal the whole
// sequence's, and the cache still counts every position (the rotation's offset).
TEST(IncrementalLayers, WindowedLayersKeepOnlyWhatLaterQueriesSee) {
  torch::NoGradGuard no_grad;
  const std::vector<int64_t> chunks{5, 1, 1, 3, 2};
  const std::vector<std::pair<json, std::vector<int64_t>>> cases{
      {{{"sliding_window", 3}}, {2, 2, 2, 2, 2}},   // kept after 5, 6, 7, 10, 12 positions
      {{{"attention_chunk", 4}}, {1, 2, 3, 2, 0}},  // the positions of the current chunk
      {{{"sliding_window", 1}}, {0, 0, 0, 0, 0}},
      {json::object(), {5, 6, 7, 10, 12}}};
  for (const auto& [extra, expected] : cases) {
    json block{{"name", "b"}, {"type", "llama_block"}, {"d_model", 16}, {"n_heads", 4}, {"n_kv_heads", 2}, {"d_ff", 24}};
    block.update(extra);
    models::Model m = layer_list(json::array({{{"name", "embed"}, {"type", "embedding"}, {"num_embeddings", 50}, {"embedding_dim", 16}},
                                              block}),
                                 12);
    m.layers->eval();
    const at::Tensor tokens = torch::randint(0, 50, {2, 12}, torch::kLong);
    const at::Tensor whole = models::forward_with_skips(m.layers, tokens);
    std::vector<models::IncrementalLayer*> layers;
    for (const auto& l : m.layers->children()) layers.push_back(dynamic_cast<models::IncrementalLayer*>(l.get()));
    std::vector<models::KvCache> caches(layers.size());
    int64_t offset = 0;
    for (size_t c = 0; c < chunks.size(); ++c) {
      at::Tensor x = tokens.narrow(1, offset, chunks[c]);
      for (size_t i = 0; i < layers.size(); ++i) x = layers[i]->forward_at(x, offset, caches[i]);
      EXPECT_LE(max_diff(x, whole.narrow(1, offset, chunks[c])), 1e-12) << extra.dump() << " chunk " << c;
      offset += chunks[c];
      EXPECT_EQ(caches[1].k.size(2), expected[c]) << extra.dump() << " after " << offset;
      EXPECT_EQ(caches[1].length(), offset) << extra.dump();
    }
  }
}

TEST(IncrementalLayers, LayersThatMixPositionsWithoutACacheAreNot) {
  const json embed{{"name", "embed"}, {"type", "embedding"}, {"num_embeddings", 40}, {"embedding_dim", 16}};
  const json head{{"name", "head"}, {"type", "linear"}, {"in_features", 16}, {"out_features", 40}};
  const std::vector<json> mixing{
      {{"name", "block"}, {"type", "transformer_block"}, {"d_model", 16}, {"n_heads", 2}},
      {{"name", "t"}, {"type", "softmax"}, {"dim", 1}},  // over the positions
  };
  for (const json& layer : mixing) {
    models::Model m = layer_list(json::array({embed, layer, head}), 8);
    EXPECT_FALSE(models::generates_incrementally(m.layers)) << layer.dump();
    // The window re-runs instead, giving what no cache gives.
    const std::vector<int64_t> prompt{1, 2, 3};
    EXPECT_EQ(models::generate_tokens(m.layers, prompt, greedy(12, 8, true)),
              models::generate_tokens(m.layers, prompt, greedy(12, 8, false)));
  }
  EXPECT_TRUE(models::generates_incrementally(layer_list(json::array({embed, head}), 8).layers));
}

TEST(IncrementalLayers, CachedGenerationEqualsTheWindowReRunBeyondTheWindow) {
  for (const auto& [name, layers] :
       {std::pair<std::string, json>{"llama", llama_layers()}, {"gpt2", gpt2_layers()}}) {
    models::Model m = layer_list(layers, 10);
    const std::vector<int64_t> prompt{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9};  // longer than the window
    for (int64_t n : {0, 1, 7, 30}) {
      const auto cached = models::generate_tokens(m.layers, prompt, greedy(n, 10, true));
      EXPECT_EQ(static_cast<int64_t>(cached.size()), n);
      EXPECT_EQ(cached, models::generate_tokens(m.layers, prompt, greedy(n, 10, false))) << name << " " << n;
    }
    models::GenerateOptions sampled = greedy(30, 10, true);
    sampled.temperature = 0.9;
    sampled.top_k = 6;
    sampled.seed = 5;
    const auto a = models::generate_tokens(m.layers, {7}, sampled);
    sampled.cache = false;
    EXPECT_EQ(a, models::generate_tokens(m.layers, {7}, sampled)) << name;
  }
}

namespace {

models::Model hf_model(const std::string& dir, int64_t seq_len) { return test::hf_build(dir, seq_len); }

// The cases by group, each group a test of its own (each makes its models with transformers once).
// phi3-longrope: the cache kept with the short factors is dropped when the sequence passes 6
// positions, and the window runs again with the long ones (transformers' generate drops its cache
// there too).
struct HfGroup {
  std::string name;
  std::vector<std::string> cases;
};

const std::vector<HfGroup>& hf_groups() {
  static const std::vector<HfGroup> groups{
      {"llama_mistral_qwen", {"llama", "llama3-tied", "mistral", "ministral3", "qwen2", "qwen3", "qwen3-yarn"}},
      {"phi_olmo_granite_smollm", {"phi3", "phi3-longrope", "olmo2", "olmo3", "granite", "smollm3"}},
      {"gemma_gpt2", {"gemma", "gemma2", "gemma3", "gpt2"}},
      {"experts", {"mixtral", "qwen2-moe", "qwen3-moe", "olmoe", "granitemoe", "granitemoe-shared"}},
      {"deepseek_glm_gptoss", {"deepseek-v2", "deepseek-v3", "deepseek-v3-lite", "glm4-moe", "gpt-oss"}},
      {"llama4", {"llama4", "llama4-top2", "llama4-vision"}},
      {"glm4_ernie_exaone_minimax", {"glm4", "ernie4_5", "exaone4", "minimax-m2"}},
      {"arcee_apertus_hunyuan_cohere_starcoder2_seed", {"arcee", "apertus", "hunyuan", "cohere", "cohere-qk", "cohere2", "starcoder2", "seed-oss"}},
      {"qwen3_next_qwen3_5", {"qwen3-next", "qwen3.5", "qwen3.5-moe"}},
      {"gptneox_phi_stablelm_falcon_gptj_bigcode_olmo",
       {"gpt-neox", "gpt-neox-sequential", "phi", "phi-qk", "stablelm", "stablelm-parallel-qk", "falcon", "falcon-40b", "falcon-sequential",
        "gptj", "gpt-bigcode", "gpt-bigcode-mha", "olmo"}},
      // Not nemotron-h-dense: its steps' floor (time_step_min 0.01) binds, and transformers' generate
      // steps without it (mamba2_selective_state_update takes no limit) where its forward clamps:
      // its greedy tokens part from its own without a cache after 12 (float32); ours keep the floor
      // and equal its greedy tokens without a cache.
      {"mamba_hybrids", {"granitemoehybrid", "granitemoehybrid-dense", "nemotron-h", "bamba"}},
  };
  return groups;
}

void PrintTo(const HfGroup& group, std::ostream* os) { *os << group.name; }

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ",") + n;
  return s;
}

// The oracle's Python with one thread: generation with these tiny models is thousands of small
// operations, which two tests running side by side with a thread pool each on two cores slow
// several times over (OpenMP's threads wait spinning).
std::string oracle() { return "OMP_NUM_THREADS=1 " + python() + " " + hf_oracle(); }

// The group's models alone (float32 and float64), made by transformers in a directory of their own.
std::string hf_models(const HfGroup& group) {
  const std::string d = scratch() + "/hf-" + group.name;
  const Result made = shell(oracle() + " models " + d + " " + joined(group.cases) + " 2>&1");
  EXPECT_EQ(made.status, 0) << made.out;
  return d;
}

class GenerateHf : public ::testing::TestWithParam<HfGroup> {
 protected:
  void SetUp() override {
    if (!has_transformers())
      GTEST_SKIP() << "the project's Python has no transformers (scripts/setup.sh installs it)";
    at::set_num_threads(1);  // as the oracle's (above)
  }
};

}  // namespace

TEST_P(GenerateHf, CachedEqualsTheWindowReRunTokenForToken) {
  const std::string cases = hf_models(GetParam());
  for (const std::string& arch : GetParam().cases)
    for (const char* dtype : {"float32", "float64"}) {
      const std::string where = arch + "-" + dtype;
      models::Model m = hf_model(cases + "/" + where + "/model", 12);
      ASSERT_TRUE(models::generates_incrementally(m.layers)) << where;
      const std::vector<int64_t> prompt{5, 17, 3, 42, 8};
      // 30 new tokens: past the window of 12, which then slides.
      const auto cached = models::generate_tokens(m.layers, prompt, greedy(30, 12, true));
      EXPECT_EQ(cached.size(), 30u) << where;
      EXPECT_EQ(cached, models::generate_tokens(m.layers, prompt, greedy(30, 12, false))) << where;
    }
}

TEST_P(GenerateHf, GreedyEqualsTransformersGenerate) {
  const std::string cases = hf_models(GetParam());
  std::vector<std::string> dirs;
  for (const std::string& arch : GetParam().cases)
    for (const char* dtype : {"float32", "float64"}) dirs.push_back(cases + "/" + arch + "-" + dtype + "/model");
  std::string command = oracle() + " generate 5,17,3,42 24";
  for (const std::string& dir : dirs) command += " " + dir;
  const Result r = shell(command + " 2>/dev/null");
  ASSERT_EQ(r.status, 0) << r.out;
  const json all = json::parse(r.out.substr(r.out.find('{')));
  for (const std::string& dir : dirs) {
    const json& theirs = all.at(dir);
    models::Model m = hf_model(dir, 32);
    models::GenerateOptions o = greedy(24, 32, true);
    o.stop_id = theirs["eos"].get<int64_t>();  // transformers stops at the end-of-text id
    const auto ours = models::generate_tokens(m.layers, {5, 17, 3, 42}, o);
    EXPECT_EQ(ids_text(ours), ids_text(theirs["new"].get<std::vector<int64_t>>())) << dir;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GenerateHf, ::testing::ValuesIn(hf_groups()),
                         [](const ::testing::TestParamInfo<HfGroup>& info) { return info.param.name; });

namespace {

// A Llama checkpoint directory as save_pretrained writes one, made without Python: config.json by
// hand, random weights from the list the family builds for it, written by save_hf.
std::string made_llama() {
  static const std::string out = [] {
    const std::string src = scratch() + "/llama-src", dir = scratch() + "/llama";
    std::filesystem::create_directories(src);
    const json config{{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"vocab_size", 40},
                      {"hidden_size", 16},
                      {"intermediate_size", 24},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"rms_norm_eps", 1e-6},
                      {"tie_word_embeddings", false},
                      {"dtype", "float32"}};
    std::ofstream(src + "/config.json") << config.dump(2);
    json list = models::read_hf_spec(src, 16, "test").layers;
    list["family"] = "layers";
    std::map<std::string, at::Tensor> weights;
    for (const auto& p : build(list, 11).layers->named_parameters()) weights[p.key()] = p.value();
    models::save_hf(src, weights, dir, 1 << 30);
    return dir;
  }();
  return out;
}

std::string hf_config() {
  return write_config("generate_hf.json",
                      json{{"model", {{"family", "hf"}, {"path", made_llama()}, {"seq_len", 16}}}}.dump());
}

}  // namespace

TEST(CliGenerate, TokenIdsFromAnHfModelAsTheApiGivesThem) {
  const std::string cfg = hf_config();
  models::Model m = hf_model(made_llama(), 16);
  const std::vector<int64_t> prompt{1, 2, 3};
  const auto api = models::generate_tokens(m.layers, prompt, greedy(20, 16, true));
  const std::string expected = ids_text({1, 2, 3}) + " " + ids_text(api) + "\n";
  const Result cached =
      shell(std::string(PIPETRAIN_BINARY) + " generate " + cfg +
            " --prompt-ids '1 2 3' --tokens 20 --temperature 0 --timing 2>" + scratch() + "/timing");
  ASSERT_EQ(cached.status, 0) << cached.out;
  EXPECT_EQ(cached.out, expected);
  std::ifstream timing(scratch() + "/timing");
  const std::string said((std::istreambuf_iterator<char>(timing)), {});
  EXPECT_NE(said.find("generated 20 tokens in"), std::string::npos) << said;
  EXPECT_NE(said.find("(key/value cache)"), std::string::npos) << said;
  const Result plain =
      run("generate " + cfg + " --prompt-ids 1,2,3 --tokens 20 --temperature 0 --no-cache --timing");
  ASSERT_EQ(plain.status, 0) << plain.out;
  EXPECT_NE(plain.out.find(expected), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("(the window re-run per token)"), std::string::npos) << plain.out;
  // Sampling: the same seed, the same ids.
  const std::string sample =
      "generate " + cfg + " --prompt-ids '4 5' --tokens 12 --temperature 0.8 --top-k 5 --seed ";
  EXPECT_EQ(run(sample + "7").out, run(sample + "7").out);
  // --stop-id ends the output at that id.
  const Result stopped =
      run("generate " + cfg + " --prompt-ids '1 2 3' --tokens 20 --temperature 0 --stop-id " +
          std::to_string(api[2]));
  const auto stop = std::find(api.begin(), api.end(), api[2]);
  EXPECT_EQ(stopped.out, ids_text({1, 2, 3}) + " " + ids_text({api.begin(), stop + 1}) + "\n");
}

TEST(CliGenerate, BadPromptsAreOneLineErrors) {
  const std::string cfg = hf_config();
  expect_clean_error(run("generate " + cfg + " --prompt 'Hello'"),
                     "--prompt is text, for a byte-level model");
  expect_clean_error(run("generate " + cfg), "give the prompt as --prompt-ids");
  expect_clean_error(run("generate " + cfg + " --prompt-ids '1 two'"),
                     "--prompt-ids takes token ids as integers");
  expect_clean_error(run("generate " + cfg + " --prompt-ids ' '"), "--prompt-ids holds no token id");
  expect_clean_error(run("generate " + cfg + " --prompt-ids '1 40'"),
                     "the prompt's id 1 is 40, not in [0, 40)");
  expect_clean_error(run("generate " + cfg + " --prompt-ids '1' --top-k 41"), "top_k");
  expect_clean_error(run("generate " + cfg + " --prompt-ids '1' --stop-id 40"), "stop_id 40");
  expect_clean_error(run("generate " + cfg + " --prompt-ids 1 --prompt a"), "--prompt");
  const std::string gpt =
      write_config("generate_gpt.json", R"({"model": {"family": "gpt", "vocab_size": 256, "seq_len": 8}})");
  expect_clean_error(run("generate " + gpt + " --prompt a"),
                     "--checkpoint is required for a model of family 'gpt'");
}

TEST(CliGenerate, ByteLevelTextStaysText) {
  const std::string text = scratch() + "/text.txt";
  {
    std::ofstream f(text);
    for (int i = 0; i < 200; ++i) f << "the quick brown fox jumps over the lazy dog\n";
  }
  const std::string cfg = write_config("generate_bytes.json",
                                       json{{"model",
                                             {{"family", "gpt"},
                                              {"vocab_size", 256},
                                              {"seq_len", 8},
                                              {"d_model", 16},
                                              {"n_heads", 2},
                                              {"n_layers", 1}}},
                                            {"data", {{"kind", "text"}, {"path", text}, {"batch_size", 4}}},
                                            {"pipeline", {{"stages", 1}, {"micro_batches", 1}}},
                                            {"train", {{"steps", 2}}}}
                                           .dump());
  const std::string ckpt = scratch() + "/bytes-ckpt";
  const Result trained = run("train " + cfg + " --quiet --checkpoint-dir " + ckpt);
  ASSERT_EQ(trained.status, 0) << trained.out;
  const Result out =
      run("generate " + cfg + " --checkpoint " + ckpt + " --prompt 'the ' --bytes 12 --temperature 0");
  ASSERT_EQ(out.status, 0) << out.out;
  EXPECT_EQ(out.out.size(), 4u + 12u + 1u) << out.out;
  EXPECT_EQ(out.out.rfind("the ", 0), 0u) << out.out;
  // The same model continues token ids as well.
  const Result ids = run("generate " + cfg + " --checkpoint " + ckpt +
                         " --prompt-ids '116 104 101 32' --tokens 12 --temperature 0");
  ASSERT_EQ(ids.status, 0) << ids.out;
  std::string decoded;
  std::istringstream in(ids.out);
  for (int64_t id; in >> id;) decoded.push_back(static_cast<char>(id));
  EXPECT_EQ(decoded + "\n", out.out);
}
