// layers: a network written in the config as an ordered list of named layers (GPipe's own
// interface, Keras' and DeepSpeed's LayerSpec): PyTorch's module names in lower case and its
// constructor arguments' names, skips by name (stash on any layer, merged by add or concat, across
// stages through models/skip.h), blocks repeated, parameters tied by name. Each layer's output
// shape is worked out when the model is built, so a mismatch names the layer and both shapes.
// docs/models.md lists every type with an example.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include <torch/torch.h>

#include "common/error.h"
#include "common/strings.h"
#include "models/decoder.h"
#include "models/families.h"
#include "models/incremental.h"
#include "models/layers.h"
#include "models/max_pool.h"
#include "models/skip.h"

namespace pipetrain::models {

namespace F = torch::nn::functional;

namespace {

using Shape = std::vector<int64_t>;  // one sample's shape (no batch dimension)
using Make = std::function<std::shared_ptr<torch::nn::Module>()>;
using Run = std::function<at::Tensor(torch::nn::Module*, const at::Tensor&)>;
// How a layer runs on the next positions alone (IncrementalLayer::forward_at); none: it cannot.
using Step = std::function<at::Tensor(torch::nn::Module*, const at::Tensor&, int64_t offset, KvCache&)>;

// One layer of a list: its operation (a module registered under the type's short name, so that
// its parameters are "<layer>.<module>.<PyTorch's name>"; none for a function), then the skip it
// merges (add or concat) and the skip it stashes its output under.
class ListLayerImpl : public torch::nn::Cloneable<ListLayerImpl>, public SkipDeclaring, public IncrementalLayer {
 public:
  ListLayerImpl(std::string module_name, Make make, Run run, Step step, std::string stash, std::string pop, bool concat,
                int64_t concat_dim)
      : module_name_(std::move(module_name)), make_(std::move(make)), run_(std::move(run)), step_(std::move(step)),
        stash_(std::move(stash)), pop_(std::move(pop)), concat_(concat), concat_dim_(concat_dim) {
    reset();
  }
  void reset() override {
    op_ = make_ ? register_module(module_name_, make_()) : nullptr;
  }
  at::Tensor forward(const at::Tensor& x) { return merge_skips(run_(op_.get(), x)); }
  bool incremental() const override { return static_cast<bool>(step_); }
  at::Tensor forward_at(const at::Tensor& x, int64_t offset, KvCache& cache) override {
    PIPETRAIN_CHECK(step_);
    return merge_skips(step_(op_.get(), x, offset, cache));
  }
  std::vector<std::string> stashes() const override { return stash_.empty() ? std::vector<std::string>{} : std::vector<std::string>{stash_}; }
  std::vector<std::string> pops() const override { return pop_.empty() ? std::vector<std::string>{} : std::vector<std::string>{pop_}; }

 private:
  at::Tensor merge_skips(at::Tensor h) {
    if (!pop_.empty()) {
      const at::Tensor other = pop(pop_);
      h = concat_ ? torch::cat({h, other.to(h.scalar_type())}, concat_dim_) : h + other;
    }
    if (!stash_.empty()) stash(stash_, h);
    return h;
  }

  std::string module_name_;
  Make make_;
  Run run_;
  Step step_;
  std::string stash_, pop_;
  bool concat_;
  int64_t concat_dim_;
  std::shared_ptr<torch::nn::Module> op_;
};
TORCH_MODULE(ListLayer);

std::string shape_text(const Shape& s) {
  std::vector<std::string> parts;
  for (int64_t d : s) parts.push_back(std::to_string(d));
  return "[" + join(parts, ", ") + "]";
}

// A layer's reading: its reader, its name for messages, and the sample shape it is given.
struct Ctx {
  JsonReader& r;
  std::string name;
  const Shape& in;
  bool tokens;  // the input holds token ids (only an embedding takes them)
  [[noreturn]] void fail(const std::string& msg) const {
    std::string w = r.where("_");
    w.resize(w.size() - 2);  // the layer's path, without the key
    throw ConfigError(w + " (" + name + "): " + msg);
  }
  void need_rank(size_t rank, const std::string& what) const {
    if (in.size() != rank)
      fail(detail::concat("expects ", what, " (", rank, " dimensions per sample), gets ", shape_text(in)));
  }
};

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
int64_t conv_out(const Ctx& c, int64_t in, int64_t k, int64_t stride, int64_t pad, const std::string& what) {
  const int64_t out = (in + 2 * pad - k) / stride + 1;
  if (in + 2 * pad < k || out < 1)
    c.fail(detail::concat(what, " of ", k, " does not fit an input of ", in, " (padding ", pad, ") in ", shape_text(c.in)));
  return out;
}

struct Built {
  Make make;
  Run run;
  // Running on the next positions alone: the same run (a layer that acts on each position apart,
  // the sample's first dimension being the positions), or a step of its own (an embedding with
  // learned positions, a decoder block); neither: the layer needs the whole window.
  bool per_position = false;
  Step step;
  std::string module_name;
  Shape out;
  int random_streams = 0;  // dropout streams the layer uses (it takes them from the list's counter)
  double params = 0;       // the values of its parameters and buffers, counted before they are made
};

// A PyTorch dim over [batch, sample...] as a dim of the sample.
int64_t sample_dim(const Ctx& c, int64_t dim, const std::string& key) {
  const int64_t rank = static_cast<int64_t>(c.in.size()) + 1;
  const int64_t d = dim < 0 ? dim + rank : dim;
  if (d < 1 || d >= rank) c.fail(detail::concat(key, " ", dim, " is not a dimension of a sample of ", shape_text(c.in), " (dimension 0 is the batch)"));
  return d - 1;
}

// A decoder block (models/decoder.h) over [sequence, d_model]: its module, size and steps.
template <class Impl, class Options>
void decoder_block(const Ctx& c, Built& b, const Options& o, const std::string& module, Make make) {
  if (c.in[1] != o.d_model) c.fail(detail::concat("expects d_model ", o.d_model, ", gets ", c.in[1], " (input ", shape_text(c.in), ")"));
  b.module_name = module;
  b.params = parameter_values(o);
  b.make = std::move(make);
  b.run = through<Impl>();
  b.step = cached<Impl>();
  b.out = c.in;
}

Built build_one(const std::string& type, Ctx& c, uint64_t stream) {
  JsonReader& r = c.r;
  Built b;
  const Shape& in = c.in;
  if (c.tokens && type != "embedding") c.fail("gets token ids: only an embedding takes them");
  auto positive = [&](const std::string& k) { return r.require_int(k, 1, int64_t{1} << 30); };
  if (type == "linear") {
    const int64_t fin = positive("in_features"), fout = positive("out_features");
    const bool bias = r.get_bool("bias", true);
    if (in.empty() || in.back() != fin)
      c.fail(detail::concat("expects ", fin, " input features, gets ", in.empty() ? std::string("a scalar") : std::to_string(in.back()),
                            " (input ", shape_text(in), ")"));
    b.module_name = "linear";
    b.params = double(fin) * double(fout) + (bias ? double(fout) : 0.0);
    b.make = [=] { return torch::nn::Linear(torch::nn::LinearOptions(fin, fout).bias(bias)).ptr(); };
    b.run = [](torch::nn::Module* m, const at::Tensor& x) {
      auto* l = static_cast<torch::nn::LinearImpl*>(m);
      return linear(x, l->weight, l->bias);  // autocast caches the cast weight (layers.cpp)
    };
    b.per_position = in.size() >= 2;
    b.out = in;
    b.out.back() = fout;
  } else if (type == "conv1d" || type == "conv2d") {
    const size_t spatial = type == "conv1d" ? 1 : 2;
    c.need_rank(spatial + 1, spatial == 1 ? "[channels, length]" : "[channels, height, width]");
    const int64_t cin = positive("in_channels"), cout = positive("out_channels"), k = positive("kernel_size");
    const int64_t stride = r.get_int("stride", 1, 1, 1 << 16), pad = r.get_int("padding", 0, 0, 1 << 16);
    const int64_t groups = r.get_int("groups", 1, 1, 1 << 20);
    const bool bias = r.get_bool("bias", true);
    if (in[0] != cin) c.fail(detail::concat("expects ", cin, " input channels, gets ", in[0], " (input ", shape_text(in), ")"));
    if (cin % groups || cout % groups) r.fail("groups", detail::concat("must divide in_channels (", cin, ") and out_channels (", cout, ")"));
    b.module_name = "conv";
    b.params = double(cout) * double(cin / groups) * std::pow(double(k), double(spatial)) + (bias ? double(cout) : 0.0);
    b.out = {cout};
    for (size_t d = 1; d < in.size(); ++d) b.out.push_back(conv_out(c, in[d], k, stride, pad, "a kernel"));
    if (spatial == 1) {
      b.make = [=] { return torch::nn::Conv1d(torch::nn::Conv1dOptions(cin, cout, k).stride(stride).padding(pad).groups(groups).bias(bias)).ptr(); };
      b.run = through<torch::nn::Conv1dImpl>();
    } else {
      b.make = [=] { return torch::nn::Conv2d(torch::nn::Conv2dOptions(cin, cout, k).stride(stride).padding(pad).groups(groups).bias(bias)).ptr(); };
      b.run = through<torch::nn::Conv2dImpl>();
    }
  } else if (type == "maxpool1d" || type == "maxpool2d" || type == "avgpool1d" || type == "avgpool2d") {
    const size_t spatial = type.find("1d") != std::string::npos ? 1 : 2;
    c.need_rank(spatial + 1, spatial == 1 ? "[channels, length]" : "[channels, height, width]");
    const int64_t k = positive("kernel_size"), stride = r.get_int("stride", k, 1, 1 << 16);
    const int64_t pad = r.get_int("padding", 0, 0, k / 2);
    b.out = {in[0]};
    for (size_t d = 1; d < in.size(); ++d) b.out.push_back(conv_out(c, in[d], k, stride, pad, "a window"));
    const bool max = type.rfind("max", 0) == 0;
    b.run = function([=](const at::Tensor& x) {
      if (spatial == 1) return max ? torch::max_pool1d(x, k, stride, pad) : torch::avg_pool1d(x, k, stride, pad);
      if (max && k == 2 && stride == 2 && pad == 0) return max_pool2x2(x);  // models/max_pool.h
      return max ? torch::max_pool2d(x, k, stride, pad) : torch::avg_pool2d(x, k, stride, pad);
    });
  } else if (type == "adaptiveavgpool1d" || type == "adaptiveavgpool2d") {
    const size_t spatial = type == "adaptiveavgpool1d" ? 1 : 2;
    c.need_rank(spatial + 1, spatial == 1 ? "[channels, length]" : "[channels, height, width]");
    const int64_t o = positive("output_size");
    b.out = {in[0]};
    for (size_t d = 1; d < in.size(); ++d) b.out.push_back(o);
    b.run = function([=](const at::Tensor& x) {
      return spatial == 1 ? torch::adaptive_avg_pool1d(x, {o}) : torch::adaptive_avg_pool2d(x, {o, o});
    });
  } else if (type == "batchnorm1d" || type == "batchnorm2d") {
    c.need_rank(type == "batchnorm1d" ? (in.size() == 1 ? 1 : 2) : 3,
                type == "batchnorm1d" ? "[features] or [channels, length]" : "[channels, height, width]");
    const int64_t f = positive("num_features");
    const double momentum = r.get_number("momentum", 0.1, 0.0, 1.0), eps = r.get_number("eps", 1e-5, 1e-12, 1.0);
    if (in[0] != f) c.fail(detail::concat("expects ", f, " features, gets ", in[0], " (input ", shape_text(in), ")"));
    b.module_name = "bn";
    b.params = 4.0 * double(f);  // weight, bias, running mean and variance
    b.make = [=] { return BatchNorm(f, momentum, eps).ptr(); };
    b.run = through<BatchNormImpl>();
    b.out = in;
  } else if (type == "layernorm" || type == "rmsnorm") {
    std::vector<int64_t> norm;
    const nlohmann::json* v = r.get_raw("normalized_shape");
    if (!v) r.fail("normalized_shape", "is required (the trailing dimensions to normalize)");
    if (v->is_number_integer()) norm = {v->get<int64_t>()};
    else if (v->is_array()) for (const auto& e : *v) norm.push_back(e.is_number_integer() ? e.get<int64_t>() : -1);
    if (norm.empty() || std::any_of(norm.begin(), norm.end(), [](int64_t d) { return d < 1; }))
      r.fail("normalized_shape", "expected a positive integer or a list of them");
    const double eps = r.get_number("eps", type == "layernorm" ? 1e-5 : 1e-6, 1e-12, 1.0);
    if (norm.size() > in.size() || !std::equal(norm.begin(), norm.end(), in.end() - static_cast<long>(norm.size())))
      c.fail(detail::concat("normalizes the trailing dimensions ", shape_text(norm), ", gets ", shape_text(in)));
    b.out = in;
    double n = 1;
    for (int64_t d : norm) n *= double(d);
    b.params = type == "layernorm" ? 2 * n : n;
    b.per_position = norm.size() < in.size();
    if (type == "layernorm") {
      b.module_name = "ln";
      b.make = [=] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions(norm).eps(eps)).ptr(); };
      b.run = through<torch::nn::LayerNormImpl>();
    } else {
      b.module_name = "rms";
      b.make = [=] { return RmsNorm(norm, eps).ptr(); };
      b.run = through<RmsNormImpl>();
    }
  } else if (type == "dropout") {
    const double p = r.get_number("p", 0.5, 0.0, 0.99);
    b.module_name = "dropout";
    b.make = [=] { return Dropout(p, stream).ptr(); };
    b.run = through<DropoutImpl>();
    b.per_position = true;  // in evaluation, where generation runs it
    b.out = in;
    b.random_streams = 1;
  } else if (type == "embedding") {
    if (!c.tokens) c.fail("takes token ids (model.input_dtype \"long\"), gets float input");
    c.need_rank(1, "[sequence] token ids");
    const int64_t vocab = positive("num_embeddings"), d = positive("embedding_dim");
    const int64_t positions = r.get_int("max_positions", 0, 0, int64_t{1} << 24);
    const double p = r.get_number("dropout", 0.0, 0.0, 0.99);
    if (positions > 0 && in[0] > positions)
      c.fail(detail::concat("has ", positions, " positions (max_positions), gets sequences of ", in[0]));
    b.out = {in[0], d};
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
      b.make = [=] { return torch::nn::Embedding(vocab, d).ptr(); };
      b.run = through<torch::nn::EmbeddingImpl>();
      b.per_position = true;
    }
  } else if (type == "transformer_block") {
    c.need_rank(2, "[sequence, d_model]");
    const int64_t d = positive("d_model"), heads = positive("n_heads");
    const int64_t ff = r.get_int("d_ff", 4 * d, 1, 1 << 24);
    const double p = r.get_number("dropout", 0.0, 0.0, 0.99);
    const bool causal = r.get_bool("causal", true);
    if (d % heads) r.fail("n_heads", detail::concat("must divide d_model (", d, ")"));
    if (in[1] != d) c.fail(detail::concat("expects d_model ", d, ", gets ", in[1], " (input ", shape_text(in), ")"));
    b.module_name = "block";
    b.params = 4.0 * double(d) * double(d) + 2.0 * double(d) * double(ff) + 9.0 * double(d) + double(ff);
    b.make = [=] { return Block(d, heads, ff, p, stream, causal).ptr(); };
    b.run = through<BlockImpl>();
    b.out = in;
    b.random_streams = 3;
  } else if (type == "llama_block") {
    c.need_rank(2, "[sequence, d_model]");
    const LlamaBlockOptions o = read_llama_block(r);
    decoder_block<LlamaBlockImpl>(c, b, o, "llama", [o] { return LlamaBlock(o).ptr(); });
  } else if (type == "gpt2_block") {
    c.need_rank(2, "[sequence, d_model]");
    const Gpt2BlockOptions o = read_gpt2_block(r);
    decoder_block<Gpt2BlockImpl>(c, b, o, "gpt2", [o, stream] { return Gpt2Block(o, stream).ptr(); });
    b.random_streams = 3;
  } else if (type == "mlp_block") {
    if (in.empty()) c.fail("expects [..., d_model] input, gets a scalar");
    const int64_t d = positive("d_model"), ff = r.get_int("d_ff", 4 * d, 1, 1 << 24);
    const double p = r.get_number("dropout", 0.0, 0.0, 0.99);
    if (in.back() != d) c.fail(detail::concat("expects d_model ", d, ", gets ", in.back(), " (input ", shape_text(in), ")"));
    b.module_name = "mlp";
    b.params = 2.0 * double(d) * double(ff) + 3.0 * double(d) + double(ff);
    b.make = [=] { return MlpBlock(d, ff, p, stream).ptr(); };
    b.run = through<MlpBlockImpl>();
    b.per_position = in.size() >= 2;
    b.out = in;
    b.random_streams = 1;
  } else if (type == "relu" || type == "gelu" || type == "silu" || type == "tanh" || type == "sigmoid") {
    b.out = in;
    static const std::map<std::string, at::Tensor (*)(const at::Tensor&)> fns{
        {"relu", [](const at::Tensor& x) { return torch::relu(x); }},
        {"gelu", [](const at::Tensor& x) { return F::gelu(x); }},
        {"silu", [](const at::Tensor& x) { return F::silu(x); }},
        {"tanh", [](const at::Tensor& x) { return torch::tanh(x); }},
        {"sigmoid", [](const at::Tensor& x) { return torch::sigmoid(x); }}};
    b.run = function(fns.at(type));
    b.per_position = true;
  } else if (type == "softmax") {
    const int64_t dim = sample_dim(c, r.get_int("dim", -1, -64, 64), "dim") + 1;
    b.out = in;
    b.run = function([dim](const at::Tensor& x) { return torch::softmax(x, dim); });
    b.per_position = dim >= 2;
  } else if (type == "flatten") {
    const int64_t start = sample_dim(c, r.get_int("start_dim", 1, -64, 64), "start_dim");
    b.out.assign(in.begin(), in.begin() + start);
    int64_t n = 1;
    for (size_t d = static_cast<size_t>(start); d < in.size(); ++d) n *= in[d];
    b.out.push_back(n);
    b.run = function([start](const at::Tensor& x) { return x.flatten(start + 1); });
  } else if (type == "reshape") {
    const std::vector<double> want = r.get_numbers("shape", {});
    int64_t known = 1, free = -1, n = 1;
    for (int64_t d : in) n *= d;
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
    if (known != n) c.fail(detail::concat("reshapes ", shape_text(in), " (", n, " values) into ", shape_text(out)));
    b.out = out;
    b.run = function([out](const at::Tensor& x) {
      std::vector<int64_t> s{x.size(0)};
      s.insert(s.end(), out.begin(), out.end());
      return x.reshape(s);
    });
  } else if (type == "permute") {  // PyTorch's dims, the batch's (0) first and staying there
    const std::vector<double> dims = r.get_numbers("dims", {});
    if (dims.empty() || dims[0] != 0) r.fail("dims", "must keep the batch (dimension 0) first");
    std::vector<int64_t> order{0};
    for (size_t i = 1; i < dims.size(); ++i) order.push_back(sample_dim(c, static_cast<int64_t>(dims[i]), "dims") + 1);
    if (std::set<int64_t>(order.begin(), order.end()).size() != in.size() + 1 || order.size() != in.size() + 1)
      r.fail("dims", detail::concat("must order all ", in.size() + 1, " dimensions of [batch] + ", shape_text(in), ", each once"));
    for (size_t i = 1; i < order.size(); ++i) b.out.push_back(in[static_cast<size_t>(order[i]) - 1]);
    b.run = function([order](const at::Tensor& x) { return x.permute(order); });
  } else if (type == "transpose") {
    const int64_t d0 = sample_dim(c, r.get_int("dim0", 1, -64, 64), "dim0") + 1, d1 = sample_dim(c, r.get_int("dim1", 2, -64, 64), "dim1") + 1;
    b.out = in;
    std::swap(b.out[static_cast<size_t>(d0 - 1)], b.out[static_cast<size_t>(d1 - 1)]);
    b.run = function([d0, d1](const at::Tensor& x) { return x.transpose(d0, d1); });
  } else if (type == "mean") {
    const int64_t dim = sample_dim(c, r.get_int("dim", -1, -64, 64), "dim");
    const bool keep = r.get_bool("keepdim", false);
    b.out = in;
    if (keep) b.out[static_cast<size_t>(dim)] = 1;
    else b.out.erase(b.out.begin() + dim);
    b.run = function([dim, keep](const at::Tensor& x) { return x.mean(dim + 1, keep); });
  } else if (type == "identity") {
    b.out = in;
    b.run = function([](const at::Tensor& x) { return x; });
    b.per_position = true;
  } else {
    throw InternalError("layer type " + type);
  }
  return b;
}

const std::vector<std::string>& layer_types() {
  static const std::vector<std::string> t{
      "linear",      "conv1d",      "conv2d",      "maxpool1d",         "maxpool2d",         "avgpool1d",
      "avgpool2d",   "adaptiveavgpool1d", "adaptiveavgpool2d", "batchnorm1d", "batchnorm2d", "layernorm",
      "rmsnorm",     "dropout",     "embedding",   "transformer_block", "llama_block", "gpt2_block", "mlp_block", "relu",
      "gelu",        "silu",        "tanh",        "sigmoid",           "softmax",           "flatten",
      "reshape",     "permute",     "transpose",   "mean",              "identity",          "add",
      "concat",      "repeat"};
  return t;
}

bool valid_name(const std::string& n) {
  return !n.empty() && n.size() <= 64 &&
         std::all_of(n.begin(), n.end(), [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; });
}

constexpr size_t kMaxLayers = 4096;  // as the families' layer counts: far beyond any pipeline's stages
constexpr double kMaxSampleValues = double(int64_t{1} << 40);  // one sample's values at any layer

// The machine's memory in float32 values: what a list's parameters may reach when it is built.
double memory_values() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) / 4.0 : 1e12;
}
double& limit_of_parameters() {
  static double limit = memory_values();
  return limit;
}

// One sample's shape at a layer: at most kMaxSampleValues values, so no product of its sizes
// overflows.
void check_volume(const Ctx& c, const Shape& s) {
  double n = 1;
  for (int64_t d : s) n *= double(d);
  if (n > kMaxSampleValues) c.fail(detail::concat("gives samples of ", shape_text(s), ": more than 2^40 values each"));
}

std::string bytes_text(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  for (; b >= 1024 && u < 6; ++u) b /= 1024;
  return detail::concat(std::round(b * 10) / 10, " ", units[u]);
}

// Builds the list in order: the layers, shapes, skips and names.
struct ListBuilder {
  Model& m;
  Shape shape;
  bool tokens;
  uint64_t stream = 0;
  std::map<std::string, Shape> open_skips;  // stashed, not yet merged: their shapes
  std::set<std::string> names;
  double params = 0;  // the values of the layers' parameters and buffers so far

  void add(JsonReader& r, const std::string& suffix, int depth) {
    const std::string type = r.get_choice("type", "", layer_types());
    if (type.empty()) r.fail("type", "is required; one of: " + join(layer_types(), ", "));
    if (type == "repeat") {  // the block's layers, `count` times, their names numbered (fc_0, fc_1, ...)
      if (depth >= 4) r.fail("type", "repeat nested more than 4 deep");
      const int64_t count = r.require_int("count", 1, 4096);
      if (r.objects("layers").empty()) r.fail("layers", "is required: the block to repeat, a list of layers");
      for (int64_t i = 0; i < count; ++i)
        for (JsonReader& e : r.objects("layers")) add(e, suffix + "_" + std::to_string(i), depth + 1);
      r.finish();
      return;
    }
    if (m.layers->size() >= kMaxLayers)
      r.fail("type", detail::concat("the list makes more than ", kMaxLayers, " layers (after repeats)"));
    std::string name = r.get_string("name", "");
    if (!valid_name(name)) r.fail("name", "is required: letters, digits and _ (at most 64), unique in the list");
    name += suffix;
    if (!names.insert(name).second) r.fail("name", "'" + name + "' names another layer already");
    const std::string stash_name = r.get_string("stash", "");
    std::string pop_name;
    bool concat = false;
    int64_t concat_dim = 1;
    Ctx c{r, name, shape, tokens};
    Built b;
    if (type == "add" || type == "concat") {
      pop_name = r.get_string("from", "");
      auto it = open_skips.find(pop_name);
      if (it == open_skips.end())
        r.fail("from", pop_name.empty() ? "is required: the name a layer before stashed its output under"
                                        : "'" + pop_name + "' is not stashed by a layer before this one (or was merged already)");
      const Shape& other = it->second;
      b.out = shape;
      b.run = function([](const at::Tensor& x) { return x; });
      b.per_position = true;
      if (type == "add") {
        if (other != shape) c.fail(detail::concat("adds ", pop_name, " of ", shape_text(other), " to ", shape_text(shape)));
      } else {
        concat = true;
        const int64_t d = sample_dim(c, r.get_int("dim", 1, -64, 64), "dim");
        concat_dim = d + 1;
        b.per_position = d >= 1;
        Shape a = shape, o = other;
        if (a.size() != o.size()) c.fail(detail::concat("concatenates ", pop_name, " of ", shape_text(other), " to ", shape_text(shape)));
        a[static_cast<size_t>(d)] = o[static_cast<size_t>(d)] = 0;
        if (a != o) c.fail(detail::concat("concatenates ", pop_name, " of ", shape_text(other), " to ", shape_text(shape), " along dim ", d + 1));
        b.out[static_cast<size_t>(d)] += other[static_cast<size_t>(d)];
      }
      open_skips.erase(it);
    } else {
      b = build_one(type, c, stream);
    }
    if (!stash_name.empty()) {
      if (!valid_name(stash_name)) r.fail("stash", "letters, digits and _ (at most 64)");
      if (open_skips.count(stash_name)) r.fail("stash", "'" + stash_name + "' is stashed already and not yet merged");
      open_skips[stash_name] = b.out;
    }
    r.finish();
    check_volume(c, b.out);
    params += b.params;  // checked before the layer's tensors are made
    if (params > parameter_limit())
      c.fail(detail::concat("brings the model to ", params, " parameter values (", bytes_text(4 * params),
                            " in float32), more than this machine's memory holds (", bytes_text(4 * parameter_limit()), ")"));
    stream += static_cast<uint64_t>(b.random_streams);
    Step step = b.step;
    if (!step && b.per_position)
      step = [run = b.run](torch::nn::Module* op, const at::Tensor& x, int64_t, KvCache&) { return run(op, x); };
    m.layers->push_back(std::string(name), ListLayer(b.module_name, b.make, b.run, step, stash_name, pop_name, concat, concat_dim));
    shape = b.out;
    tokens = false;
  }
};

}  // namespace

void read_input(JsonReader& r, Model& m) {
  const std::vector<double> input = r.get_numbers("input_shape", {});
  if (input.empty()) r.fail("input_shape", "is required: one sample's shape without the batch, e.g. [1, 28, 28]");
  for (double d : input) {
    if (d < 1 || d > double(int64_t{1} << 30) || d != static_cast<double>(static_cast<int64_t>(d)))
      r.fail("input_shape", "expected positive integers");
    m.sample_shape.push_back(static_cast<int64_t>(d));
  }
  m.token_input = r.get_choice("input_dtype", "float", {"float", "long"}) == "long";
  double n = 1;
  for (int64_t d : m.sample_shape) n *= double(d);
  if (n > kMaxSampleValues) r.fail("input_shape", "more than 2^40 values per sample");
}

void set_parameter_limit(double values) { limit_of_parameters() = values; }
double parameter_limit() { return limit_of_parameters(); }

Model build_layer_list(JsonReader& r) {
  Model m;
  m.layers = torch::nn::Sequential();
  read_input(r, m);
  ListBuilder b{m, m.sample_shape, m.token_input, 0, {}, {}, 0};
  std::vector<JsonReader> layers = r.objects("layers");
  if (layers.empty()) r.fail("layers", "is required: a list of layers, each {\"name\": ..., \"type\": ...}");
  for (JsonReader& e : layers) b.add(e, "", 0);
  if (!b.open_skips.empty())
    r.fail("layers", "'" + b.open_skips.begin()->first + "' is stashed and never merged (add or concat with \"from\")");
  if (b.shape.empty()) r.fail("layers", "the last layer gives a scalar per sample; it must give class scores");
  m.classes = b.shape.back();
  // Ties by the parameters' full names: "<layer>.<module>.<parameter>".
  const nlohmann::json* ties = r.get_raw("ties");
  if (ties && !ties->is_array()) r.fail("ties", "expected a list of lists of parameter names");
  const auto all = m.layers->named_parameters();
  for (size_t t = 0; ties && t < ties->size(); ++t) {
    const auto& group = (*ties)[t];
    const std::string key = "ties[" + std::to_string(t) + "]";
    if (!group.is_array() || group.size() < 2) r.fail(key, "expected a list of at least two parameter names");
    Tie tie;
    at::Tensor first;
    for (const auto& e : group) {
      const std::string full = e.is_string() ? e.get<std::string>() : "";
      const size_t dot = full.find('.');
      if (!all.contains(full) || dot == std::string::npos)
        r.fail(key, "'" + full + "' is not a parameter of the model (names are <layer>.<module>.<parameter>, e.g. " +
                        (all.is_empty() ? std::string("head.linear.weight") : all.begin()->key()) + ")");
      for (const ParamRef& p : tie)
        if (full == layer_names(m.layers)[static_cast<size_t>(p.layer)] + "." + p.name) r.fail(key, "names '" + full + "' twice");
      const std::string layer = full.substr(0, dot);
      const auto names = layer_names(m.layers);
      const int index = static_cast<int>(std::find(names.begin(), names.end(), layer) - names.begin());
      const at::Tensor p = all[full];
      if (first.defined() && p.sizes() != first.sizes())
        r.fail(key, detail::concat("'", full, "' has shape ", p.sizes(), ", the first of the tie ", first.sizes()));
      if (!first.defined()) first = p;
      tie.push_back({index, full.substr(dot + 1)});
    }
    torch::NoGradGuard no_grad;
    for (size_t i = 1; i < tie.size(); ++i) all[detail::concat(layer_names(m.layers)[tie[i].layer], ".", tie[i].name)].copy_(first);
    m.ties.push_back(tie);
  }
  return m;
}

}  // namespace pipetrain::models
