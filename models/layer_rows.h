// The builders behind the rows of the layer table (layer_table.cpp lists them).
#pragma once

#include "models/layer_table.h"

namespace pipetrain::models::rows {

Built linear(LayerContext& c);
Built conv(LayerContext& c);           // conv1d, conv2d
Built pool(LayerContext& c);           // maxpool1d, maxpool2d, avgpool1d, avgpool2d
Built adaptive_pool(LayerContext& c);  // adaptiveavgpool1d, adaptiveavgpool2d
Built upsample(LayerContext& c);
Built batchnorm(LayerContext& c);      // batchnorm1d, batchnorm2d
Built norm(LayerContext& c);           // layernorm, rmsnorm
Built dropout(LayerContext& c);
Built embedding(LayerContext& c);
Built transformer_block(LayerContext& c);
Built llama_block(LayerContext& c);
Built gpt2_block(LayerContext& c);
Built mlp_block(LayerContext& c);
Built activation(LayerContext& c);     // relu, gelu, silu, tanh, sigmoid, identity
Built softcap(LayerContext& c);
Built scale(LayerContext& c);
Built softmax(LayerContext& c);
Built flatten(LayerContext& c);
Built reshape(LayerContext& c);
Built permute(LayerContext& c);
Built transpose(LayerContext& c);
Built mean(LayerContext& c);

}  // namespace pipetrain::models::rows
