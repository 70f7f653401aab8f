// pss/keras.hpp: the whole library with its Keras-style layer (Model, Sequential, Dense, Embedding, the losses,
// metrics, callbacks and initializers)
// and the datasets read from files (pss/data.hpp);
// the root of the second generated single header. Kept apart from pss/pss.hpp because it costs a third
// of a translation unit's compile time, which a program using only strategies and variables need not pay.
#pragma once

#include <pss/pss.hpp>

#include <pss/data.hpp>

#include <pss/keras/callbacks.hpp>
#include <pss/keras/initializers.hpp>
#include <pss/keras/layers.hpp>
#include <pss/keras/losses.hpp>
#include <pss/keras/metrics.hpp>
#include <pss/keras/model.hpp>

// The default configurations' models, instantiated once in the library under PSS_SEPARATE_COMPILATION.
PSS_NAMESPACE_BEGIN
PSS_INSTANTIATE(class Model<ParameterServerStrategy<>>)
PSS_INSTANTIATE(class Model<ClusterStrategy<>>)
PSS_INSTANTIATE(class Sequential<ParameterServerStrategy<>>)
PSS_INSTANTIATE(class Sequential<ClusterStrategy<>>)
PSS_NAMESPACE_END
