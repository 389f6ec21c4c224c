//! The `seckill` command: the allocator, then the library's command line (`src/cli.rs`).

use std::process::ExitCode;

/// Every request allocates and frees dozens of small buffers: glibc's malloc and free were
/// a third of the sold-out path's instructions; mimalloc cut the path from 69k to 60k
/// instructions per request (callgrind).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    seckill::cli::main().await
}
