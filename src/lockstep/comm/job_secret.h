// The secret every rank of a job shares, so the rendezvous store serves only the job's own
// ranks (tcp_protocol.h's handshake). `lockstep run` makes one per job and passes it in
// LOCKSTEP_JOB_SECRET; a job another launcher started (mpirun, srun, torchrun) derives it
// from a key only its user can read (~/.lockstep/job-key, made on first use, 0600) and what
// every rank of the job already shares (the job id, MASTER_ADDR and MASTER_PORT), so
// another user's processes cannot join or read the job's keys.
#pragma once

#include <string>

#include "lockstep/comm/launch_env.h"

namespace lockstep::comm {

inline constexpr const char* kJobSecretVariable = "LOCKSTEP_JOB_SECRET";

// 32 random bytes as 64 hex digits: a fresh secret for a launcher to hand its workers.
std::string make_job_secret();

// The job's secret as raw bytes: LOCKSTEP_JOB_SECRET (64 hex digits) when set, else derived
// from the user's key. Error naming the variable or the key file when either is unusable
// (a malformed value; a key file another user owns or others may read).
std::string job_secret(const LaunchInfo& info);

// HMAC-SHA256 of message under key: 32 raw bytes.
std::string hmac_sha256(const std::string& key, const std::string& message);

// `count` bytes from the kernel's random source.
std::string random_bytes(size_t count);

// Bytes as lowercase hex digits, two per byte.
std::string to_hex(const std::string& bytes);

}  // namespace lockstep::comm
