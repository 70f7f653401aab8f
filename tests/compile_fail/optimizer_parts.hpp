// tests/compile_fail/optimizer_parts.hpp: what the optimizer compile-fail tests share: the dense half of
// an SGD, and a class that requires an Optimizer, as ParameterServer does.
#pragma once

#include <xtensor/xarray.hpp>

#include <pss/concepts/optimizer.hpp>

/// A learning rate, as the built-in optimizers hold it.
template <class Derived>
struct LearningRatePart {
    const pss::LearningRate& learning_rate() const { return rate; }
    Derived with_learning_rate(double r) const {
        Derived at(static_cast<const Derived&>(*this));
        at.rate = r;
        return at;
    }
    pss::LearningRate rate = 0.01;
};

/// Slots, make_slots and apply_dense of an SGD: each test adds all but the requirement it is about.
struct DenseSGDPart {
    template <class T>
    struct Slots {};
    template <class T>
    Slots<T> make_slots(const xt::xarray<T>&) const {
        return {};
    }
    template <class T>
    void apply_dense(xt::xarray<T>& value, Slots<T>&, const xt::xarray<T>& grad) const {
        value -= grad;
    }
};

template <pss::Optimizer OptimizerPolicy>
struct ParameterServerLike {
    OptimizerPolicy optimizer;
};
