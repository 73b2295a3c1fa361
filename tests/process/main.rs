//! Tests that need the process to themselves, in one test binary (each test binary links
//! gemm and rayon): they compare the process-wide counters (`ndscope::memory()`,
//! `check_leaks`, `profile`'s new arrays) before and after (the cross-thread engine, the
//! async scopes, the accounting), reset the process-wide peak, switch verbose mode
//! (process-wide), count the system manager's children or watch the resident memory.
//! Every test takes `common::serial()`, so they run one at a time and nothing else runs
//! in this process meanwhile.

#[path = "../common/mod.rs"]
mod common;

mod accounting;
mod async_scopes;
mod manager_churn;
mod threads_engine;
mod verbose;
