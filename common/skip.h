// The skip context of a thread: named values (tensors) that a layer stashes and a later layer
// pops during one forward of a layer list (a skip connection, models/skip.h). A pipeline stage
// opens a scope holding the skips that crossed into it and takes what is left when its layers
// are done (stages/stage.h). A template over the value type, so that this vocabulary needs no
// tensor library; the models and stages instantiate it with at::Tensor.
//
// The thread's innermost open scope lives in one slot defined out of line (skip.cpp), not in a
// thread_local of an inline function here: compilers mangle such a local differently (GCC tags
// it [abi:cxx11] because its type holds std::string, clang does not), so a program built by one
// compiler against the library built by the other would get a second context, and its own layers
// would not see the scope the library opened (tests/install_example.sh builds one that way).
#pragma once

#include <map>
#include <string>
#include <typeinfo>
#include <utility>

#include "common/error.h"

namespace pipetrain {

namespace detail {
/// The calling thread's innermost open skip scope for values of type `value_type` (a
/// SkipMap<value_type>*), or null: one slot per thread and value type in the whole program.
void* skip_context(const std::type_info& value_type);
/// Makes `scope` the calling thread's innermost open skip scope for `value_type`.
void set_skip_context(const std::type_info& value_type, void* scope);
}  // namespace detail

/// Named skip values (tensors).
template <typename T>
using SkipMap = std::map<std::string, T>;

/// An open skip context of the calling thread, for its lifetime (the previous one after).
template <typename T>
class SkipScope {
 public:
  /// Opens a context holding `skips`.
  explicit SkipScope(SkipMap<T> skips = {}) : skips_(std::move(skips)), previous_(current()) {
    detail::set_skip_context(typeid(T), &skips_);
  }
  ~SkipScope() { detail::set_skip_context(typeid(T), previous_); }
  SkipScope(const SkipScope&) = delete;
  SkipScope& operator=(const SkipScope&) = delete;
  /// What is left in the scope: the skips stashed and not popped, and those passing through.
  SkipMap<T> take() { return std::exchange(skips_, SkipMap<T>()); }

  /// The innermost open scope of this thread, or null.
  static SkipMap<T>* current() { return static_cast<SkipMap<T>*>(detail::skip_context(typeid(T))); }

 private:
  SkipMap<T> skips_;
  SkipMap<T>* previous_;
};

/// Puts `value` under `name` in the thread's open scope.
template <typename T>
void stash_skip(const std::string& name, T value) {
  SkipMap<T>* s = SkipScope<T>::current();
  if (!s) throw Error("stash('" + name + "'): no skip context is open on this thread");
  if (!s->emplace(name, std::move(value)).second)
    throw Error("stash('" + name + "'): a value is already stashed under that name");
}

/// Takes the value stashed under `name` out of the thread's open scope.
template <typename T>
T pop_skip(const std::string& name) {
  SkipMap<T>* s = SkipScope<T>::current();
  if (!s) throw Error("pop('" + name + "'): no skip context is open on this thread");
  auto it = s->find(name);
  if (it == s->end()) throw Error("pop('" + name + "'): nothing was stashed under that name");
  T value = std::move(it->second);
  s->erase(it);
  return value;
}

}  // namespace pipetrain
