#pragma once
// CQK_OPTION(T, name): a module option with a chaining setter, as torch's
// module options have (`CouplingOptions().kind(...).steps(4)`), without torch
// headers, so that an options struct can also be its config section (the key
// table binds `name()`, which returns a reference).
#include <utility>

#define CQK_OPTION(T, name)                                  \
 public:                                                     \
  auto name(T value)->decltype(*this) {                      \
    name##_ = std::move(value);                              \
    return *this;                                            \
  }                                                          \
  const T& name() const noexcept { return name##_; }         \
  T& name() noexcept { return name##_; }                     \
                                                             \
 private:                                                    \
  T name##_
