#include "lockstep/core/autocast.h"

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

thread_local DType current = DType::f32;

}  // namespace

DType autocast_dtype() { return current; }

AutocastGuard::AutocastGuard(DType dtype) : previous_(current) {
  LOCKSTEP_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16)
      << "autocast to " << dtype_name(dtype) << ": mixed precision computes in bf16 or f16 (f32 turns it off)";
  current = dtype;
}

AutocastGuard::~AutocastGuard() { current = previous_; }

}  // namespace lockstep
