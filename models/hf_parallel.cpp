// GPT-NeoX (Pythia), Phi (Phi-1, 1.5 and 2), StableLM, Falcon and GPT-J (the `hf` family,
// models/hf_fields.h): LayerNorms of a weight and a bias, rotary positions over the first part of
// each head (Falcon's whole head; GPT-J's interleaved pairs), and attention beside the MLP (GPT-NeoX's
// two norms, Phi's one, StableLM's one, Falcon's one or two, GPT-J's one; or one after the other), as
// transformers' GPTNeoXForCausalLM, PhiForCausalLM, StableLmForCausalLM, FalconForCausalLM and
// GPTJForCausalLM compute them; and GPT-BigCode (StarCoder 1, SantaCoder), GPT-2's layers with one key
// head, whose LayerNorms and fused heads it shares.
// All but GPT-BigCode are read as Llama's layers (their sizes, rope and padding), then given their
// own parts and names.
#include <string>
#include <vector>

#include "models/hf_fields.h"

namespace pipetrain::models::hf_detail {
namespace {

using nlohmann::json;

// What the families read as Llama's share, from config.json.
struct Common {
  int64_t n = 0, heads = 0, kv = 0, d = 0;
  double partial = 1;                  // the rotated part of a head
  double attention = 0, residual = 0;  // dropouts: of the attention weights; of both branches' outputs
  double embedding = 0;                // of the embeddings
  std::string act;                     // the llama_block's
};

double probability(const Fields& f, const char* key) { return dropout_probability(f, key, 0.0); }

// transformers' hidden_act as a llama_block's act: the GELUs, and SiLU where `silu` (StableLM's).
std::string act_of(const Fields& f, const std::string& def, bool silu, const std::string& key = "hidden_act") {
  const std::string a = f.string(key, def);
  if (a == "gelu" || a == "gelu_new" || a == "gelu_fast") return a;
  if (a == "gelu_pytorch_tanh") return "gelu_tanh";
  if (silu && a == "silu") return a;
  f.fail(key, "'" + a + "' is not supported (" + (silu ? "silu, " : "") + "gelu, gelu_new, gelu_fast, gelu_pytorch_tanh)");
}

// Llama's reading of the sizes, rope (without its partial factor, given below), eps and padding:
// config.json as Llama's reader takes it.
void as_llama(const Fields& f, json llama, const Common& c, int64_t seq_len, bool padding, HfSpec& spec) {
  for (const char* k : {"partial_rotary_factor", "rotary_pct", "rotary_emb_base", "attention_dropout", "resid_pdrop", "embd_pdrop",
                        "hidden_dropout", "attention_bias", "mlp_bias", "bias"})
    llama.erase(k);
  for (const char* k : {"rope_parameters", "rope_scaling"})
    if (llama.contains(k) && llama[k].is_object()) llama[k].erase("partial_rotary_factor");
  if (f.has("rotary_emb_base") && !f.has("rope_theta") && !(f.has("rope_parameters") && f.at("rope_parameters").contains("rope_theta")))
    llama["rope_theta"] = f.number("rotary_emb_base", 1e4);  // GPT-NeoX's older name
  llama["rms_norm_eps"] = f.number(f.has("layer_norm_epsilon") ? "layer_norm_epsilon" : "layer_norm_eps", 1e-5);  // Falcon's name
  llama["hidden_act"] = "silu";
  llama["num_key_value_heads"] = c.kv;
  // A head of hidden_size / heads, as each computes it; a head_dim apart from that is not read by all
  // of their parts alike (GPT-NeoX's rotation reads it, its attention does not).
  if (f.has("head_dim") && f.integer("head_dim", 0, 1, 1 << 16) != c.d / c.heads)
    f.fail("head_dim", detail::concat("is not supported apart from hidden_size / heads (", c.d / c.heads, ")"));
  llama.erase("head_dim");
  if (!padding) llama.erase("pad_token_id");  // GPT-NeoX's embedding has no padding row
  llama_family(kLlama, Fields(llama, f.where()), seq_len, spec);
}

Common read_common(const Fields& f, const char* partial_key, double partial_default) {
  Common c;
  c.n = f.integer("num_hidden_layers", 0, 1, 4096, true);
  c.heads = f.integer("num_attention_heads", 0, 1, 1 << 16, true);
  c.d = f.integer("hidden_size", 0, 1, int64_t{1} << 30, true);
  c.kv = f.integer("num_key_value_heads", c.heads, 1, c.heads);
  if (c.d % c.heads) f.fail("num_attention_heads", detail::concat("must divide hidden_size (", c.d, ")"));
  if (c.heads % c.kv) f.fail("num_key_value_heads", detail::concat("must divide num_attention_heads (", c.heads, ")"));
  const json none = json::object();
  const json& rope = f.has("rope_parameters") && f.at("rope_parameters").is_object() ? f.at("rope_parameters") : none;
  if (rope.contains("partial_rotary_factor")) {
    if (!rope.at("partial_rotary_factor").is_number()) f.fail("rope_parameters.partial_rotary_factor", "must be a number");
    c.partial = rope.at("partial_rotary_factor").get<double>();
  } else {
    c.partial = f.number(partial_key, f.number("partial_rotary_factor", partial_default));
  }
  const int64_t head = c.d / c.heads, rotated = static_cast<int64_t>(static_cast<double>(head) * c.partial);
  if (!(c.partial > 0 && c.partial <= 1) || rotated < 2 || rotated % 2)
    f.fail("partial_rotary_factor", detail::concat(c.partial, " turns ", rotated, " of a head's ", head, " values; it must be in (0, 1] and turn an even number above 0"));
  return c;
}

bool ends(const std::string& s, const std::string& tail) { return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0; }

// The parts every block and the final norm take: LayerNorms (a weight and a bias), the partial
// rotation, the act, the dropouts; the embeddings' dropout a layer after embed.
void common_parts(const Common& c, HfSpec& spec) {
  json& layers = spec.layers["layers"];
  for (json& layer : layers) {
    if (layer["type"] == "llama_block") {
      layer["norm_center"] = layer["norm_bias"] = true;
      if (c.partial != 1.0) layer["partial_rotary_factor"] = c.partial;
      layer["act"] = c.act;
      if (c.residual > 0 || c.attention > 0) {  // keyed masks, not torch's (training alone)
        layer["dropout"] = c.residual;
        layer["attn_dropout"] = c.attention;
      }
    } else if (layer["name"] == "norm") {
      layer["center"] = layer["bias"] = true;
    }
  }
  if (c.embedding > 0) layers.insert(layers.begin() + 1, json{{"name", "embed_dropout"}, {"type", "dropout"}, {"p", c.embedding}});
}

// The fused query_key_value's part: `rows` rows in blocks of `block` from `offset` in every group of
// `step` rows (step 0: the rows from offset, as they are).
HfTensor fused_part(const std::string& ours, const std::string& theirs, int64_t offset, int64_t rows, int64_t block, int64_t step) {
  HfTensor x{ours, theirs};
  x.row_offset = offset;
  x.rows = rows;
  if (step > 0) {
    x.row_step = step;
    x.row_block = block;
  }
  return x;
}

// Phi's and GPT-J's blocks: one LayerNorm feeding attention and an MLP without a gate side by side,
// summed (attention + MLP) + x, the MLP's biases; the head's bias.
void one_norm_side_by_side(HfSpec& spec) {
  for (json& layer : spec.layers["layers"]) {
    if (layer["type"] == "llama_block") {
      layer["mlp_gate"] = false;
      layer["mlp_bias"] = true;
      layer["norms"] = "parallel";
      layer["parallel_sum"] = "branches_first";  // attn_output + feed_forward_hidden_states + residual
    } else if (layer["name"] == "lm_head") {
      layer["bias"] = true;
    }
  }
}

// A weight's name and, with `bias`, its bias's.
void add(std::vector<HfTensor>& tensors, const std::string& ours, const std::string& theirs, bool bias) {
  tensors.push_back({ours + ".weight", theirs + ".weight"});
  if (bias) tensors.push_back({ours + ".bias", theirs + ".bias"});
}

}  // namespace

void gpt_neox(const Fields& f, const json& config, int64_t seq_len, HfSpec& spec) {
  Common c = read_common(f, "rotary_pct", 0.25);
  if (f.has("num_key_value_heads") && c.kv != c.heads) f.fail("num_key_value_heads", "must equal num_attention_heads (GPT-NeoX's heads)");
  c.act = act_of(f, "gelu", false);
  c.residual = c.embedding = probability(f, "hidden_dropout");  // the embeddings' and both branches'
  c.attention = probability(f, "attention_dropout");
  const bool parallel = f.boolean("use_parallel_residual", true), bias = f.boolean("attention_bias", true);
  json llama = config;
  llama["tie_word_embeddings"] = f.boolean("tie_word_embeddings", false);
  as_llama(f, llama, c, seq_len, false, spec);
  common_parts(c, spec);
  for (json& layer : spec.layers["layers"])
    if (layer["type"] == "llama_block") {
      layer["mlp_gate"] = false;
      layer["mlp_bias"] = true;
      layer["qkv_bias"] = layer["o_bias"] = bias;
      if (parallel) {
        layer["norms"] = "parallel_two";
        layer["parallel_sum"] = "branches_first";  // mlp_output + attn_output + hidden_states
      }
    }
  // query_key_value: each head's queries, keys and values in turn ([heads, 3, head_dim] rows).
  const int64_t D = c.d / c.heads, H = c.heads;
  std::vector<HfTensor> t{{"embed.embedding.weight", "gpt_neox.embed_in.weight"}};
  for (int64_t i = 0; i < c.n; ++i) {
    const std::string ours = detail::concat("layer_", i, ".llama."), theirs = detail::concat("gpt_neox.layers.", i, ".");
    add(t, ours + "input_layernorm", theirs + "input_layernorm", true);
    add(t, ours + "post_attention_layernorm", theirs + "post_attention_layernorm", true);
    const char* parts[] = {"q_proj", "k_proj", "v_proj"};
    for (int64_t p = 0; p < 3; ++p)
      for (const char* kind : {"weight", "bias"})
        if (bias || std::string(kind) == "weight")
          t.push_back(fused_part(detail::concat(ours, "self_attn.", parts[p], ".", kind), detail::concat(theirs, "attention.query_key_value.", kind),
                                 p * D, H * D, D, 3 * D));
    add(t, ours + "self_attn.o_proj", theirs + "attention.dense", bias);
    add(t, ours + "mlp.up_proj", theirs + "mlp.dense_h_to_4h", true);
    add(t, ours + "mlp.down_proj", theirs + "mlp.dense_4h_to_h", true);
  }
  add(t, "norm.rms", "gpt_neox.final_layer_norm", true);
  t.push_back({"lm_head.linear.weight", "embed_out.weight"});
  spec.tensors = t;
}

void phi(const Fields& f, const json& config, int64_t seq_len, HfSpec& spec) {
  Common c = read_common(f, "partial_rotary_factor", 0.5);
  c.act = act_of(f, "gelu_new", false);
  c.residual = probability(f, "resid_pdrop");
  c.attention = probability(f, "attention_dropout");
  c.embedding = probability(f, "embd_pdrop");
  const bool qk_norm = f.boolean("qk_layernorm", false);
  json llama = config;
  llama["tie_word_embeddings"] = f.boolean("tie_word_embeddings", false);
  as_llama(f, llama, c, seq_len, true, spec);
  common_parts(c, spec);
  one_norm_side_by_side(spec);
  for (json& layer : spec.layers["layers"])
    if (layer["type"] == "llama_block") {
      layer["qkv_bias"] = layer["o_bias"] = true;
      if (qk_norm) layer["qk_norm"] = layer["qk_norm_bias"] = true;  // one LayerNorm of a head's values for every head, a weight and a bias
    }
  std::vector<HfTensor> t{{"embed.embedding.weight", "model.embed_tokens.weight"}};
  for (int64_t i = 0; i < c.n; ++i) {
    const std::string ours = detail::concat("layer_", i, ".llama."), theirs = detail::concat("model.layers.", i, ".");
    add(t, ours + "input_layernorm", theirs + "input_layernorm", true);
    for (const char* p : {"q", "k", "v"}) add(t, ours + "self_attn." + p + "_proj", theirs + "self_attn." + p + "_proj", true);
    if (qk_norm)
      for (const char* p : {"q", "k"}) add(t, ours + "self_attn." + p + "_norm", theirs + "self_attn." + p + "_layernorm", true);
    add(t, ours + "self_attn.o_proj", theirs + "self_attn.dense", true);
    add(t, ours + "mlp.up_proj", theirs + "mlp.fc1", true);
    add(t, ours + "mlp.down_proj", theirs + "mlp.fc2", true);
  }
  add(t, "norm.rms", "model.final_layernorm", true);
  add(t, "lm_head.linear", "lm_head", true);
  spec.tensors = t;
}

void stablelm(const Fields& f, const json& config, int64_t seq_len, HfSpec& spec) {
  Common c = read_common(f, "partial_rotary_factor", 0.25);
  if (!f.has("num_key_value_heads")) {
    c.kv = 32;  // StableLmConfig's default
    if (c.heads % c.kv) f.fail("num_key_value_heads", detail::concat("(32, StableLmConfig's default) must divide num_attention_heads (", c.heads, ")"));
  }
  c.act = act_of(f, "silu", true);
  if (probability(f, "hidden_dropout") > 0)
    f.fail("hidden_dropout", "above 0 is not supported (StableLM drops the MLP's output alone; set it to 0.0)");
  c.attention = probability(f, "attention_dropout");
  const bool parallel = f.boolean("use_parallel_residual", false), qkv_bias = f.boolean("use_qkv_bias", false);
  const bool qk_norm = f.boolean("qk_layernorm", false);
  json llama = config;
  llama["tie_word_embeddings"] = f.boolean("tie_word_embeddings", false);
  as_llama(f, llama, c, seq_len, true, spec);
  common_parts(c, spec);
  for (json& layer : spec.layers["layers"])
    if (layer["type"] == "llama_block") {
      layer["qkv_bias"] = qkv_bias;
      if (parallel) layer["norms"] = "parallel";  // residual + self_attn_output + mlp_output
      if (qk_norm) {  // each head its own LayerNorm without a bias
        layer["qk_norm"] = true;
        layer["qk_norm_over"] = "each_head";
      }
    }
  std::vector<HfTensor> t;
  for (const HfTensor& x : spec.tensors) {
    if (parallel && ends(x.ours, "post_attention_layernorm.weight")) continue;  // one norm side by side
    t.push_back(x);
    const bool norm = ends(x.ours, "layernorm.weight") || x.ours == "norm.rms.weight";
    const bool qkv = ends(x.ours, "q_proj.weight") || ends(x.ours, "k_proj.weight") || ends(x.ours, "v_proj.weight");
    if (norm || (qkv_bias && qkv)) t.push_back({x.ours.substr(0, x.ours.size() - 6) + "bias", x.theirs.substr(0, x.theirs.size() - 6) + "bias"});
    if (qk_norm && ends(x.ours, "v_proj.weight")) {  // q_layernorm.norms.<head>.weight: row <head> of q_norm.weight
      const std::string ours = x.ours.substr(0, x.ours.size() - 13), theirs = x.theirs.substr(0, x.theirs.size() - 13);
      for (const auto& [p, count] : {std::make_pair("q", c.heads), std::make_pair("k", c.kv)})
        for (int64_t h = 0; h < count; ++h) {
          HfTensor row{detail::concat(ours, p, "_norm.weight"), detail::concat(theirs, p, "_layernorm.norms.", h, ".weight")};
          row.ours_row = h;
          t.push_back(row);
        }
    }
  }
  spec.tensors = t;
}

void falcon(const Fields& f, const json& config, int64_t seq_len, HfSpec& spec) {
  if (f.boolean("alibi", false)) f.fail("alibi", "true is not supported (ALiBi positions, falcon-rw's; rotary positions only)");
  Common c;
  c.n = f.integer("num_hidden_layers", 0, 1, 4096, true);
  c.heads = f.integer("num_attention_heads", 0, 1, 1 << 16, true);
  c.d = f.integer("hidden_size", 0, 1, int64_t{1} << 30, true);
  if (c.d % c.heads) f.fail("num_attention_heads", detail::concat("must divide hidden_size (", c.d, ")"));
  const bool fresh = f.boolean("new_decoder_architecture", false), multi_query = f.boolean("multi_query", true);
  const bool parallel = f.boolean("parallel_attn", true), bias = f.boolean("bias", false);
  // The key heads: Falcon-40B's and 180B's num_kv_heads, Falcon-7B's one (multi_query), else the heads.
  c.kv = fresh ? f.integer("num_kv_heads", c.heads, 1, c.heads) : multi_query ? 1 : c.heads;
  if (c.heads % c.kv) f.fail("num_kv_heads", detail::concat("must divide num_attention_heads (", c.heads, ")"));
  const int64_t norms = f.integer("num_ln_in_parallel_attn", fresh ? 2 : 1, 1, 2);
  if (fresh && !parallel) f.fail("parallel_attn", "false is not supported with new_decoder_architecture (transformers' Falcon cannot run it)");
  if (!fresh && norms == 2) f.fail("num_ln_in_parallel_attn", "2 needs new_decoder_architecture (transformers' Falcon cannot run it otherwise)");
  if (probability(f, "hidden_dropout") > 0) f.fail("hidden_dropout", "above 0 is not supported (set it to 0.0)");
  // With rotary positions Falcon drops no attention weights: its attention_dropout drops attention's
  // output where the layers are one after the other alone.
  if (!parallel && probability(f, "attention_dropout") > 0) f.fail("attention_dropout", "above 0 is not supported with parallel_attn false (set it to 0.0)");
  c.act = act_of(f, "gelu", false, "activation");
  json llama = config;
  llama["num_attention_heads"] = c.heads;
  llama["intermediate_size"] = f.integer("ffn_hidden_size", 4 * c.d, 1, int64_t{1} << 30);
  llama["tie_word_embeddings"] = f.boolean("tie_word_embeddings", true);
  as_llama(f, llama, c, seq_len, false, spec);
  common_parts(c, spec);
  for (json& layer : spec.layers["layers"])
    if (layer["type"] == "llama_block") {
      layer["mlp_gate"] = false;
      layer["qkv_bias"] = layer["o_bias"] = layer["mlp_bias"] = bias;
      if (bias) layer["bias_apart"] = true;  // FalconLinear's input @ weight.T + bias
      if (parallel) {
        layer["norms"] = norms == 2 ? "parallel_two" : "parallel";
        layer["parallel_sum"] = "branches_first";  // mlp_output += attention_output, then the residual
      }
      // Its keys as it hands them to sdpa: repeated for the queries (broadcast_to, then flattened),
      // or Falcon-7B's one head as it is.
      if (c.kv != c.heads) layer["kv_heads"] = fresh ? "repeated" : "broadcast";
    }
  // query_key_value: Falcon-40B's groups of a key head's queries, its key and its value; Falcon-7B's
  // queries, then the one key, then the one value; else each head's query, key and value in turn.
  const int64_t D = c.d / c.heads, H = c.heads, kv = c.kv, per = c.heads / c.kv;
  std::vector<HfTensor> t{{"embed.embedding.weight", "transformer.word_embeddings.weight"}};
  for (int64_t i = 0; i < c.n; ++i) {
    const std::string ours = detail::concat("layer_", i, ".llama."), theirs = detail::concat("transformer.h.", i, ".");
    if (norms == 2) {
      add(t, ours + "input_layernorm", theirs + "ln_attn", true);
      add(t, ours + "post_attention_layernorm", theirs + "ln_mlp", true);
    } else {
      add(t, ours + "input_layernorm", theirs + "input_layernorm", true);
      if (!parallel) add(t, ours + "post_attention_layernorm", theirs + "post_attention_layernorm", true);
    }
    for (const char* kind : {"weight", "bias"}) {
      if (!bias && std::string(kind) == "bias") continue;
      const std::string fused = detail::concat(theirs, "self_attention.query_key_value.", kind);
      auto part = [&](const char* p) { return detail::concat(ours, "self_attn.", p, "_proj.", kind); };
      if (fresh) {
        t.push_back(fused_part(part("q"), fused, 0, H * D, per * D, (per + 2) * D));
        t.push_back(fused_part(part("k"), fused, per * D, kv * D, D, (per + 2) * D));
        t.push_back(fused_part(part("v"), fused, (per + 1) * D, kv * D, D, (per + 2) * D));
      } else if (multi_query) {
        t.push_back(fused_part(part("q"), fused, 0, H * D, 0, 0));
        t.push_back(fused_part(part("k"), fused, H * D, D, 0, 0));
        t.push_back(fused_part(part("v"), fused, H * D + D, D, 0, 0));
      } else {
        for (int64_t p = 0; p < 3; ++p) t.push_back(fused_part(part(p == 0 ? "q" : p == 1 ? "k" : "v"), fused, p * D, H * D, D, 3 * D));
      }
    }
    add(t, ours + "self_attn.o_proj", theirs + "self_attention.dense", bias);
    add(t, ours + "mlp.up_proj", theirs + "mlp.dense_h_to_4h", bias);
    add(t, ours + "mlp.down_proj", theirs + "mlp.dense_4h_to_h", bias);
  }
  add(t, "norm.rms", "transformer.ln_f", true);
  t.push_back({"lm_head.linear.weight", "lm_head.weight"});
  spec.tensors = t;
}

void gptj(const Fields& f, const json& config, int64_t seq_len, HfSpec& spec) {
  Common c;
  c.n = f.integer("n_layer", 0, 1, 4096, true);
  c.heads = f.integer("n_head", 0, 1, 1 << 16, true);
  c.d = f.integer("n_embd", 0, 1, int64_t{1} << 30, true);
  c.kv = c.heads;
  if (c.d % c.heads) f.fail("n_head", detail::concat("must divide n_embd (", c.d, ")"));
  const int64_t D = c.d / c.heads, positions = f.integer("n_positions", 2048, 1, int64_t{1} << 30);
  // The rotated values at the start of each head as interleaved pairs (rotate_every_two).
  if (!f.has("rotary_dim") && c.heads > 1) f.fail("rotary_dim", "null is not supported (transformers' GPT-J rotates rotary_dim values of each head)");
  const int64_t rotated = f.integer("rotary_dim", D, 2, D);
  c.partial = static_cast<double>(rotated) / static_cast<double>(D);
  if (rotated % 2 || static_cast<int64_t>(static_cast<double>(D) * c.partial) != rotated)
    f.fail("rotary_dim", detail::concat(rotated, " must be even (of a head's ", D, " values)"));
  if (seq_len > positions) f.fail("n_positions", detail::concat(positions, " is shorter than the sequence (", seq_len, ": its position table ends there)"));
  c.act = act_of(f, "gelu_new", false, "activation_function");
  c.residual = probability(f, "resid_pdrop");
  c.attention = probability(f, "attn_pdrop");
  c.embedding = probability(f, "embd_pdrop");
  json llama = json::object();  // GPT-J's sizes under Llama's names; its rope's base fixed at 10000
  llama["vocab_size"] = f.integer("vocab_size", 50400, 1, int64_t{1} << 30);
  llama["hidden_size"] = c.d;
  llama["num_hidden_layers"] = c.n;
  llama["num_attention_heads"] = c.heads;
  llama["intermediate_size"] = f.integer("n_inner", 4 * c.d, 1, int64_t{1} << 30);
  llama["max_position_embeddings"] = positions;
  llama["rms_norm_eps"] = f.number("layer_norm_epsilon", 1e-5);
  llama["tie_word_embeddings"] = f.boolean("tie_word_embeddings", false);
  as_llama(f, llama, c, seq_len, false, spec);
  common_parts(c, spec);
  one_norm_side_by_side(spec);
  for (json& layer : spec.layers["layers"])
    if (layer["type"] == "llama_block") layer["rope_interleave"] = layer["rope_pairs_kept"] = true;
  std::vector<HfTensor> t{{"embed.embedding.weight", "transformer.wte.weight"}};
  for (int64_t i = 0; i < c.n; ++i) {
    const std::string ours = detail::concat("layer_", i, ".llama."), theirs = detail::concat("transformer.h.", i, ".");
    add(t, ours + "input_layernorm", theirs + "ln_1", true);
    for (const char* p : {"q", "k", "v"}) add(t, ours + "self_attn." + p + "_proj", theirs + "attn." + p + "_proj", false);
    add(t, ours + "self_attn.o_proj", theirs + "attn.out_proj", false);
    add(t, ours + "mlp.up_proj", theirs + "mlp.fc_in", true);
    add(t, ours + "mlp.down_proj", theirs + "mlp.fc_out", true);
  }
  add(t, "norm.rms", "transformer.ln_f", true);
  add(t, "lm_head.linear", "lm_head", true);
  spec.tensors = t;
}

void gpt_bigcode(const Fields& f, const json& /*config*/, int64_t seq_len, HfSpec& spec) {
  const auto [vocab, d, n, heads, positions, ff] = gpt2_sizes(f, seq_len);
  if (f.boolean("add_cross_attention", false)) f.fail("add_cross_attention", "true is not supported (a decoder without cross-attention)");
  const bool multi_query = f.boolean("multi_query", true);
  const int64_t D = d / heads, kv = multi_query ? 1 : heads;
  auto pdrop = [&](const char* k) { return dropout_probability(f, k, 0.1); };  // GPTBigCodeConfig's defaults
  const double eps = f.number("layer_norm_epsilon", 1e-5);
  json layers = json::array({gpt2_embedding(f, vocab, d, positions, spec)});
  // GPT-2's block with one key head (multi_query) as a llama_block without rotary positions.
  json block{{"type", "llama_block"}, {"d_model", d}, {"n_heads", heads}, {"n_kv_heads", kv}, {"d_ff", ff}, {"eps", eps},
             {"rotary", false}, {"norm_center", true}, {"norm_bias", true}, {"mlp_gate", false}, {"qkv_bias", true}, {"o_bias", true},
             {"mlp_bias", true}, {"act", act_of(f, "gelu_pytorch_tanh", false, "activation_function")}};
  if (!f.boolean("scale_attn_weights", true)) block["attn_scale"] = 1.0;  // the scores unscaled
  const double residual = pdrop("resid_pdrop"), attention = pdrop("attn_pdrop");
  if (residual > 0 || attention > 0) {  // keyed masks, not torch's (training alone)
    block["dropout"] = residual;
    block["attn_dropout"] = attention;
  }
  for (int64_t i = 0; i < n; ++i) {
    block["name"] = detail::concat("layer_", i);
    layers.push_back(block);
    const std::string ours = detail::concat("layer_", i, ".llama."), theirs = detail::concat("transformer.h.", i, ".");
    add(spec.tensors, ours + "input_layernorm", theirs + "ln_1", true);
    add(spec.tensors, ours + "post_attention_layernorm", theirs + "ln_2", true);
    // c_attn: the queries, then the one key and value (multi_query); else each head's in turn.
    for (const char* kind : {"weight", "bias"}) {
      const std::string fused = detail::concat(theirs, "attn.c_attn.", kind);
      auto part = [&](const char* p) { return detail::concat(ours, "self_attn.", p, "_proj.", kind); };
      if (multi_query) {
        spec.tensors.push_back(fused_part(part("q"), fused, 0, d, 0, 0));
        spec.tensors.push_back(fused_part(part("k"), fused, d, D, 0, 0));
        spec.tensors.push_back(fused_part(part("v"), fused, d + D, D, 0, 0));
      } else {
        for (int64_t p = 0; p < 3; ++p) spec.tensors.push_back(fused_part(part(p == 0 ? "q" : p == 1 ? "k" : "v"), fused, p * D, d, D, 3 * D));
      }
    }
    add(spec.tensors, ours + "self_attn.o_proj", theirs + "attn.c_proj", true);
    add(spec.tensors, ours + "mlp.up_proj", theirs + "mlp.c_fc", true);
    add(spec.tensors, ours + "mlp.down_proj", theirs + "mlp.c_proj", true);
  }
  layers.push_back({{"name", "norm"}, {"type", "rmsnorm"}, {"normalized_shape", d}, {"eps", eps}, {"center", true}, {"bias", true}});
  add(spec.tensors, "norm.rms", "transformer.ln_f", true);
  with_head(spec, layers, d, vocab, seq_len, f.boolean("tie_word_embeddings", true), "embed.embedding.tok.weight");
}

}  // namespace pipetrain::models::hf_detail
