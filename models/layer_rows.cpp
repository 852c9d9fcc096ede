// The builders of the layer table's rows (models/layer_table.h): each reads its arguments,
// checks the sample shape it is given and says what it makes.
#include "models/layer_rows.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <torch/torch.h>

#include "common/error.h"
#include "common/strings.h"
#include "models/layers.h"
#include "models/max_pool.h"

namespace pipetrain::models {

namespace F = torch::nn::functional;

std::string shape_text(const Shape& s) {
  std::vector<std::string> parts;
  for (int64_t d : s) parts.push_back(std::to_string(d));
  return "[" + join(parts, ", ") + "]";
}

void LayerContext::fail(const std::string& msg) const {
  std::string w = r.where("_");
  w.resize(w.size() - 2);  // the layer's path, without the key
  throw ConfigError(w + " (" + name + "): " + msg);
}

void LayerContext::need_rank(size_t rank, const std::string& what) const {
  if (in.size() != rank) fail(detail::concat("expects ", what, " (", rank, " dimensions per sample), gets ", shape_text(in)));
}

int64_t LayerContext::positive(const std::string& key) const { return r.require_int(key, 1, int64_t{1} << 30); }

int64_t LayerContext::sample_dim(int64_t dim, const std::string& key) const {
  const int64_t rank = static_cast<int64_t>(in.size()) + 1;
  const int64_t d = dim < 0 ? dim + rank : dim;
  if (d < 1 || d >= rank) fail(detail::concat(key, " ", dim, " is not a dimension of a sample of ", shape_text(in), " (dimension 0 is the batch)"));
  return d - 1;
}

namespace rows {
namespace {

template <class M>
Run through() {
  return [](torch::nn::Module* m, const at::Tensor& x) { return static_cast<M*>(m)->forward(x); };
}
// A decoder block's step: its keys and values are the cache's, which must hold the positions before.
template <class M>
Step cached() {
  return [](torch::nn::Module* m, const at::Tensor& x, int64_t offset, KvCache& cache) {
    PIPETRAIN_CHECK(offset == cache.length());
    return static_cast<M*>(m)->forward_cached(x, &cache);
  };
}
Run function(std::function<at::Tensor(const at::Tensor&)> f) {
  return [f](torch::nn::Module*, const at::Tensor& x) { return f(x); };
}

// The output size of a convolution or pooling along one dimension.
int64_t conv_out(const LayerContext& c, int64_t in, int64_t k, int64_t stride, int64_t pad, const std::string& what) {
  const int64_t out = (in + 2 * pad - k) / stride + 1;
  if (in + 2 * pad < k || out < 1)
    c.fail(detail::concat(what, " of ", k, " does not fit an input of ", in, " (padding ", pad, ") in ", shape_text(c.in)));
  return out;
}

size_t spatial_of(const LayerContext& c) {
  const size_t spatial = c.type.find("1d") != std::string::npos ? 1 : 2;
  c.need_rank(spatial + 1, spatial == 1 ? "[channels, length]" : "[channels, height, width]");
  return spatial;
}

// A decoder block (models/decoder.h) over [sequence, d_model]: its module, size and steps.
template <class Impl, class Options>
void decoder_block(const LayerContext& c, Built& b, const Options& o, const std::string& module, Make make) {
  if (c.in[1] != o.d_model) c.fail(detail::concat("expects d_model ", o.d_model, ", gets ", c.in[1], " (input ", shape_text(c.in), ")"));
  b.module_name = module;
  b.params = parameter_values(o);
  b.make = std::move(make);
  b.run = through<Impl>();
  b.step = cached<Impl>();
  b.out = c.in;
}

}  // namespace

Built linear(LayerContext& c) {
  const int64_t fin = c.positive("in_features"), fout = c.positive("out_features");
  const bool bias = c.r.get_bool("bias", true);
  const Shape& in = c.in;
  if (in.empty() || in.back() != fin)
    c.fail(detail::concat("expects ", fin, " input features, gets ", in.empty() ? std::string("a scalar") : std::to_string(in.back()),
                          " (input ", shape_text(in), ")"));
  Built b;
  b.module_name = "linear";
  b.params = double(fin) * double(fout) + (bias ? double(fout) : 0.0);
  b.make = [=] { return torch::nn::Linear(torch::nn::LinearOptions(fin, fout).bias(bias)).ptr(); };
  b.run = [](torch::nn::Module* m, const at::Tensor& x) {
    auto* l = static_cast<torch::nn::LinearImpl*>(m);
    return models::linear(x, l->weight, l->bias);  // autocast caches the cast weight (layers.cpp)
  };
  b.per_position = in.size() >= 2;
  b.out = in;
  b.out.back() = fout;
  return b;
}

Built conv(LayerContext& c) {
  const size_t spatial = spatial_of(c);
  JsonReader& r = c.r;
  const int64_t cin = c.positive("in_channels"), cout = c.positive("out_channels"), k = c.positive("kernel_size");
  const int64_t stride = r.get_int("stride", 1, 1, 1 << 16), pad = r.get_int("padding", 0, 0, 1 << 16);
  const int64_t groups = r.get_int("groups", 1, 1, 1 << 20);
  const bool bias = r.get_bool("bias", true);
  if (c.in[0] != cin) c.fail(detail::concat("expects ", cin, " input channels, gets ", c.in[0], " (input ", shape_text(c.in), ")"));
  if (cin % groups || cout % groups) r.fail("groups", detail::concat("must divide in_channels (", cin, ") and out_channels (", cout, ")"));
  Built b;
  b.module_name = "conv";
  b.params = double(cout) * double(cin / groups) * std::pow(double(k), double(spatial)) + (bias ? double(cout) : 0.0);
  b.out = {cout};
  for (size_t d = 1; d < c.in.size(); ++d) b.out.push_back(conv_out(c, c.in[d], k, stride, pad, "a kernel"));
  if (spatial == 1) {
    b.make = [=] { return torch::nn::Conv1d(torch::nn::Conv1dOptions(cin, cout, k).stride(stride).padding(pad).groups(groups).bias(bias)).ptr(); };
    b.run = through<torch::nn::Conv1dImpl>();
  } else {
    b.make = [=] { return torch::nn::Conv2d(torch::nn::Conv2dOptions(cin, cout, k).stride(stride).padding(pad).groups(groups).bias(bias)).ptr(); };
    b.run = through<torch::nn::Conv2dImpl>();
  }
  return b;
}

Built pool(LayerContext& c) {
  const size_t spatial = spatial_of(c);
  const int64_t k = c.positive("kernel_size"), stride = c.r.get_int("stride", k, 1, 1 << 16);
  const int64_t pad = c.r.get_int("padding", 0, 0, k / 2);
  Built b;
  b.out = {c.in[0]};
  for (size_t d = 1; d < c.in.size(); ++d) b.out.push_back(conv_out(c, c.in[d], k, stride, pad, "a window"));
  const bool max = c.type.rfind("max", 0) == 0;
  b.run = function([=](const at::Tensor& x) {
    if (spatial == 1) return max ? torch::max_pool1d(x, k, stride, pad) : torch::avg_pool1d(x, k, stride, pad);
    if (max && k == 2 && stride == 2 && pad == 0) return max_pool2x2(x);  // models/max_pool.h
    return max ? torch::max_pool2d(x, k, stride, pad) : torch::avg_pool2d(x, k, stride, pad);
  });
  return b;
}

Built adaptive_pool(LayerContext& c) {
  const size_t spatial = spatial_of(c);
  const int64_t o = c.positive("output_size");
  Built b;
  b.out = {c.in[0]};
  for (size_t d = 1; d < c.in.size(); ++d) b.out.push_back(o);
  b.run = function([=](const at::Tensor& x) {
    return spatial == 1 ? torch::adaptive_avg_pool1d(x, {o}) : torch::adaptive_avg_pool2d(x, {o, o});
  });
  return b;
}

Built upsample(LayerContext& c) {
  if (c.in.size() != 3) c.need_rank(3, "[channels, height, width]");
  const int64_t s = c.r.get_int("scale_factor", 2, 1, 64);
  Built b;
  b.out = {c.in[0], c.in[1] * s, c.in[2] * s};
  b.run = function([s](const at::Tensor& x) { return torch::upsample_nearest2d(x, {x.size(2) * s, x.size(3) * s}); });
  return b;
}

Built batchnorm(LayerContext& c) {
  const bool one = c.type == "batchnorm1d";
  c.need_rank(one ? (c.in.size() == 1 ? 1 : 2) : 3, one ? "[features] or [channels, length]" : "[channels, height, width]");
  const int64_t f = c.positive("num_features");
  const double momentum = c.r.get_number("momentum", 0.1, 0.0, 1.0), eps = c.r.get_number("eps", 1e-5, 1e-12, 1.0);
  if (c.in[0] != f) c.fail(detail::concat("expects ", f, " features, gets ", c.in[0], " (input ", shape_text(c.in), ")"));
  Built b;
  b.module_name = "bn";
  b.params = 4.0 * double(f);  // weight, bias, running mean and variance
  b.make = [=] { return BatchNorm(f, momentum, eps).ptr(); };
  b.run = through<BatchNormImpl>();
  b.out = c.in;
  return b;
}

Built norm(LayerContext& c) {
  JsonReader& r = c.r;
  std::vector<int64_t> shape;
  const nlohmann::json* v = r.get_raw("normalized_shape");
  if (!v) r.fail("normalized_shape", "is required (the trailing dimensions to normalize)");
  if (v->is_number_integer()) shape = {v->get<int64_t>()};
  else if (v->is_array()) for (const auto& e : *v) shape.push_back(e.is_number_integer() ? e.get<int64_t>() : -1);
  if (shape.empty() || std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 1; }))
    r.fail("normalized_shape", "expected a positive integer or a list of them");
  const bool layer = c.type == "layernorm";
  const double eps = r.get_number("eps", layer ? 1e-5 : 1e-6, 1e-12, 1.0);
  const Shape& in = c.in;
  if (shape.size() > in.size() || !std::equal(shape.begin(), shape.end(), in.end() - static_cast<long>(shape.size())))
    c.fail(detail::concat("normalizes the trailing dimensions ", shape_text(shape), ", gets ", shape_text(in)));
  Built b;
  b.out = in;
  double n = 1;
  for (int64_t d : shape) n *= double(d);
  b.params = layer ? 2 * n : n;
  b.per_position = shape.size() < in.size();
  if (layer) {
    b.module_name = "ln";
    b.make = [=] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions(shape).eps(eps)).ptr(); };
    b.run = through<torch::nn::LayerNormImpl>();
  } else {
    b.module_name = "rms";
    const RmsScale scale = read_rms_scale(r, "scale");
    const bool center = r.get_bool("center", false), bias = r.get_bool("bias", false);
    if (bias && !center) r.fail("bias", "needs center true (a LayerNorm)");
    if (bias) b.params = 2 * n;
    if (scale == RmsScale::None && (!center || bias)) r.fail("scale", "\"none\" needs center true and bias false (a LayerNorm without parameters)");
    if (scale == RmsScale::None) b.params = 0;
    b.make = [=] { return RmsNorm(shape, eps, scale, center, 0, bias).ptr(); };
    b.run = through<RmsNormImpl>();
  }
  return b;
}

Built dropout(LayerContext& c) {
  const double p = c.r.get_number("p", 0.5, 0.0, 0.99);
  const uint64_t stream = c.stream;
  Built b;
  b.module_name = "dropout";
  b.make = [=] { return Dropout(p, stream).ptr(); };
  b.run = through<DropoutImpl>();
  b.per_position = true;  // in evaluation, where generation runs it
  b.out = c.in;
  b.random_streams = 1;
  return b;
}

Built embedding(LayerContext& c) {
  if (!c.tokens) c.fail("takes token ids (model.input_dtype \"long\"), gets float input");
  c.need_rank(1, "[sequence] token ids");
  JsonReader& r = c.r;
  const int64_t vocab = c.positive("num_embeddings"), d = c.positive("embedding_dim");
  const int64_t positions = r.get_int("max_positions", 0, 0, int64_t{1} << 24);
  const double p = r.get_number("dropout", 0.0, 0.0, 0.99);
  if (positions > 0 && c.in[0] > positions)
    c.fail(detail::concat("has ", positions, " positions (max_positions), gets sequences of ", c.in[0]));
  const int64_t padding = r.has("padding_idx") ? r.get_int("padding_idx", 0, 0, vocab - 1) : -1;
  if (padding >= 0 && positions > 0) r.fail("padding_idx", "needs an embedding without max_positions");
  if (r.has("scale") && positions > 0) r.fail("scale", "needs an embedding without max_positions");
  const uint64_t stream = c.stream;
  Built b;
  b.out = {c.in[0], d};
  b.module_name = "embedding";
  b.params = (double(vocab) + double(positions)) * double(d);
  if (positions > 0) {  // token and learned position embedding, then dropout: the gpt's embed
    b.make = [=] { return Embedding(vocab, positions, d, p, stream).ptr(); };
    b.run = through<EmbeddingImpl>();
    b.step = [](torch::nn::Module* m, const at::Tensor& x, int64_t offset, KvCache&) {
      return static_cast<EmbeddingImpl*>(m)->forward_at(x, offset);
    };
    b.random_streams = 1;
  } else {
    if (p > 0) r.fail("dropout", "needs max_positions (or a dropout layer after the embedding)");
    // Gemma's scale: a float32 value (a buffer of transformers' embedding) in the weights' type.
    const float scale = static_cast<float>(r.get_number("scale", 1.0, 1e-6, 1e6));
    b.make = [=] {
      torch::nn::EmbeddingOptions o(vocab, d);
      if (padding >= 0) o.padding_idx(padding);
      return torch::nn::Embedding(o).ptr();
    };
    b.run = through<torch::nn::EmbeddingImpl>();
    if (scale != 1.0f)
      b.run = [scale](torch::nn::Module* m, const at::Tensor& x) {
        auto* e = static_cast<torch::nn::EmbeddingImpl*>(m);
        return e->forward(x) * at::scalar_tensor(scale, torch::kFloat).to(e->weight.scalar_type());
      };
    b.per_position = true;
  }
  return b;
}

Built transformer_block(LayerContext& c) {
  c.need_rank(2, "[sequence, d_model]");
  JsonReader& r = c.r;
  const int64_t d = c.positive("d_model"), heads = c.positive("n_heads");
  const int64_t ff = r.get_int("d_ff", 4 * d, 1, 1 << 24);
  const double p = r.get_number("dropout", 0.0, 0.0, 0.99);
  const bool causal = r.get_bool("causal", true);
  if (d % heads) r.fail("n_heads", detail::concat("must divide d_model (", d, ")"));
  if (c.in[1] != d) c.fail(detail::concat("expects d_model ", d, ", gets ", c.in[1], " (input ", shape_text(c.in), ")"));
  const uint64_t stream = c.stream;
  Built b;
  b.module_name = "block";
  b.params = 4.0 * double(d) * double(d) + 2.0 * double(d) * double(ff) + 9.0 * double(d) + double(ff);
  b.make = [=] { return Block(d, heads, ff, p, stream, causal).ptr(); };
  b.run = through<BlockImpl>();
  b.out = c.in;
  b.random_streams = 3;
  return b;
}

Built llama_block(LayerContext& c) {
  c.need_rank(2, "[sequence, d_model]");
  const LlamaBlockOptions o = read_llama_block(c.r);
  const uint64_t stream = c.stream;
  Built b;
  decoder_block<LlamaBlockImpl>(c, b, o, "llama", [o, stream] { return LlamaBlock(o, stream).ptr(); });
  if (o.dropout > 0 || o.attn_dropout > 0) b.random_streams = 3;  // none otherwise: the later layers' streams as they were
  if (o.lora.dropout > 0) b.random_streams = 3 + static_cast<int>(lora_target_names().size());  // one for each adapter's
  return b;
}

Built gpt2_block(LayerContext& c) {
  c.need_rank(2, "[sequence, d_model]");
  const Gpt2BlockOptions o = read_gpt2_block(c.r);
  const uint64_t stream = c.stream;
  Built b;
  decoder_block<Gpt2BlockImpl>(c, b, o, "gpt2", [o, stream] { return Gpt2Block(o, stream).ptr(); });
  b.random_streams = 3;
  return b;
}

Built mlp_block(LayerContext& c) {
  if (c.in.empty()) c.fail("expects [..., d_model] input, gets a scalar");
  const int64_t d = c.positive("d_model"), ff = c.r.get_int("d_ff", 4 * d, 1, 1 << 24);
  const double p = c.r.get_number("dropout", 0.0, 0.0, 0.99);
  if (c.in.back() != d) c.fail(detail::concat("expects d_model ", d, ", gets ", c.in.back(), " (input ", shape_text(c.in), ")"));
  const uint64_t stream = c.stream;
  Built b;
  b.module_name = "mlp";
  b.params = 2.0 * double(d) * double(ff) + 3.0 * double(d) + double(ff);
  b.make = [=] { return MlpBlock(d, ff, p, stream).ptr(); };
  b.run = through<MlpBlockImpl>();
  b.per_position = c.in.size() >= 2;
  b.out = c.in;
  b.random_streams = 1;
  return b;
}

Built activation(LayerContext& c) {
  static const std::map<std::string, at::Tensor (*)(const at::Tensor&)> fns{
      {"relu", [](const at::Tensor& x) { return torch::relu(x); }},
      {"gelu", [](const at::Tensor& x) { return F::gelu(x); }},
      {"silu", [](const at::Tensor& x) { return F::silu(x); }},
      {"tanh", [](const at::Tensor& x) { return torch::tanh(x); }},
      {"sigmoid", [](const at::Tensor& x) { return torch::sigmoid(x); }},
      {"identity", [](const at::Tensor& x) { return x; }}};
  Built b;
  b.out = c.in;
  b.run = function(fns.at(c.type));
  b.per_position = true;
  return b;
}

Built softcap(LayerContext& c) {
  const double cap = c.r.get_number("cap", 0.0, 1e-6, 1e6);
  if (!c.r.has("cap")) c.r.fail("cap", "is required");
  Built b;
  b.out = c.in;
  b.run = function([cap](const at::Tensor& x) { return torch::tanh(x / cap) * cap; });
  b.per_position = true;
  return b;
}

Built scale(LayerContext& c) {
  if (!c.r.has("by")) c.r.fail("by", "is required");
  const double by = c.r.get_number("by", 1.0, -1e12, 1e12);
  const bool divide = c.r.get_choice("op", "multiply", {"multiply", "divide"}) == "divide";
  if (divide && by == 0) c.r.fail("by", "must not be 0 with op divide");
  Built b;
  b.out = c.in;
  b.run = divide ? function([by](const at::Tensor& x) { return x / by; }) : function([by](const at::Tensor& x) { return x * by; });
  b.per_position = true;
  return b;
}

Built softmax(LayerContext& c) {
  const int64_t dim = c.sample_dim(c.r.get_int("dim", -1, -64, 64), "dim") + 1;
  Built b;
  b.out = c.in;
  b.run = function([dim](const at::Tensor& x) { return torch::softmax(x, dim); });
  b.per_position = dim >= 2;
  return b;
}

Built flatten(LayerContext& c) {
  const int64_t start = c.sample_dim(c.r.get_int("start_dim", 1, -64, 64), "start_dim");
  Built b;
  b.out.assign(c.in.begin(), c.in.begin() + start);
  int64_t n = 1;
  for (size_t d = static_cast<size_t>(start); d < c.in.size(); ++d) n *= c.in[d];
  b.out.push_back(n);
  b.run = function([start](const at::Tensor& x) { return x.flatten(start + 1); });
  return b;
}

Built reshape(LayerContext& c) {
  JsonReader& r = c.r;
  const std::vector<double> want = r.get_numbers("shape", {});
  int64_t known = 1, free = -1, n = 1;
  for (int64_t d : c.in) n *= d;
  Shape out;
  for (size_t i = 0; i < want.size(); ++i) {
    const double w = want[i];
    if (w == -1 && free < 0) {
      free = static_cast<int64_t>(i);
      out.push_back(-1);
      continue;
    }
    if (!(w >= 1 && w <= 1e18) || w != std::floor(w)) r.fail("shape", "expected positive integers and at most one -1");
    const auto d = static_cast<int64_t>(w);
    known = d > n / known ? n + 1 : known * d;  // beyond n: a mismatch, found without overflow
    out.push_back(d);
  }
  if (want.empty()) r.fail("shape", "is required: one sample's new shape (without the batch), e.g. [16, 7, 7]");
  if (free >= 0 && n % known == 0) out[static_cast<size_t>(free)] = n / known, known = n;
  if (known != n) c.fail(detail::concat("reshapes ", shape_text(c.in), " (", n, " values) into ", shape_text(out)));
  Built b;
  b.out = out;
  b.run = function([out](const at::Tensor& x) {
    std::vector<int64_t> s{x.size(0)};
    s.insert(s.end(), out.begin(), out.end());
    return x.reshape(s);
  });
  return b;
}

Built permute(LayerContext& c) {  // PyTorch's dims, the batch's (0) first and staying there
  const std::vector<double> dims = c.r.get_numbers("dims", {});
  if (dims.empty() || dims[0] != 0) c.r.fail("dims", "must keep the batch (dimension 0) first");
  std::vector<int64_t> order{0};
  for (size_t i = 1; i < dims.size(); ++i) order.push_back(c.sample_dim(static_cast<int64_t>(dims[i]), "dims") + 1);
  if (std::set<int64_t>(order.begin(), order.end()).size() != c.in.size() + 1 || order.size() != c.in.size() + 1)
    c.r.fail("dims", detail::concat("must order all ", c.in.size() + 1, " dimensions of [batch] + ", shape_text(c.in), ", each once"));
  Built b;
  for (size_t i = 1; i < order.size(); ++i) b.out.push_back(c.in[static_cast<size_t>(order[i]) - 1]);
  b.run = function([order](const at::Tensor& x) { return x.permute(order); });
  return b;
}

Built transpose(LayerContext& c) {
  const int64_t d0 = c.sample_dim(c.r.get_int("dim0", 1, -64, 64), "dim0") + 1;
  const int64_t d1 = c.sample_dim(c.r.get_int("dim1", 2, -64, 64), "dim1") + 1;
  Built b;
  b.out = c.in;
  std::swap(b.out[static_cast<size_t>(d0 - 1)], b.out[static_cast<size_t>(d1 - 1)]);
  b.run = function([d0, d1](const at::Tensor& x) { return x.transpose(d0, d1); });
  return b;
}

Built mean(LayerContext& c) {
  const int64_t dim = c.sample_dim(c.r.get_int("dim", -1, -64, 64), "dim");
  const bool keep = c.r.get_bool("keepdim", false);
  Built b;
  b.out = c.in;
  if (keep) b.out[static_cast<size_t>(dim)] = 1;
  else b.out.erase(b.out.begin() + dim);
  b.run = function([dim, keep](const at::Tensor& x) { return x.mean(dim + 1, keep); });
  return b;
}

}  // namespace rows
}  // namespace pipetrain::models
