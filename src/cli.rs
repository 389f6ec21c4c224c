//! The `seckill` command line: its commands, logging, and the hand-over to the roles.
//! `src/main.rs` only chooses the allocator and calls [`main`].

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use tokio_util::sync::CancellationToken;

use crate::auth::Jwt;
use crate::broker::{Broker, Topology};
use crate::delay_queue::Plan;
use crate::domain::{ItemId, UserId};
use crate::keys::Keys;
use crate::rehearsal::RehearsalArgs;
use crate::store::{RedisConns, WaitRule, connect_mysql, migrate};
use crate::warmup::{Progress, Warmup};
use crate::{Role, Server, Settings, telemetry};

#[derive(Parser)]
#[command(name = "seckill", version, about = "A flash-sale HTTP API server")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply pending migrations, then serve (every role unless --roles says otherwise).
    Serve {
        /// The roles this process runs, comma-separated.
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "api,consumer,scheduler"
        )]
        roles: Vec<Role>,
        #[command(flatten)]
        settings: Settings,
    },
    /// Apply pending migrations and exit.
    Migrate {
        #[command(flatten)]
        settings: Settings,
    },
    /// Load an item's units into Redis (as POST /admin/items/{id}/warmup does).
    Warmup {
        /// The item to load.
        #[arg(long)]
        item: ItemId,
        /// Reload an item that is already loaded (it must not be on sale right now).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        settings: Settings,
    },
    /// Print a user token signed with SECKILL_JWT_SECRET (one per line with --count).
    Token {
        /// The user id (the token's `sub`).
        #[arg(long)]
        user: u64,
        /// How long the token is valid, in seconds.
        #[arg(long, default_value_t = 3600)]
        ttl_s: u64,
        /// Print tokens for this many consecutive users, starting at --user (load tests).
        #[arg(long, default_value_t = 1)]
        count: u64,
        #[command(flatten)]
        settings: Settings,
    },
    /// Sign and send a payment event for an order to a running server, as the payment
    /// provider would (`payment.succeeded` unless --type says otherwise).
    Pay {
        #[command(flatten)]
        pay: crate::payments::send::PayArgs,
        #[command(flatten)]
        settings: Settings,
    },
    /// Rehearse a sale against a running server: fire a crowd, report answers and latency,
    /// then check the invariants against Redis and MySQL (exit 1 when one is broken).
    /// `bench`, its name before 2026-12-03, still works.
    #[command(visible_alias = "bench")]
    Rehearse {
        #[command(flatten)]
        rehearsal: Box<RehearsalArgs>,
        #[command(flatten)]
        settings: Settings,
    },
}

/// Reads `.env` and the command line, runs the command, and says how it ended.
pub async fn main() -> ExitCode {
    // A missing .env is normal; a malformed one is worth saying before anything else.
    if let Err(e) = dotenvy::dotenv()
        && !e.not_found()
    {
        eprintln!("error: reading .env: {e}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    match run(cli.command).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve { roles, settings } => {
            let _logs = telemetry::init();
            let server = Server::build(settings, &roles).await?;
            let shutdown = CancellationToken::new();
            tokio::spawn(stop_on_signal(shutdown.clone()));
            server.run(shutdown).await
        }
        Command::Migrate { settings } => {
            let _logs = telemetry::init();
            let db = connect_mysql(settings.database_url.expose()).await?;
            migrate(&db).await?;
            tracing::info!("migrations applied");
            Ok(())
        }
        Command::Warmup {
            item,
            force,
            settings,
        } => warmup(item, force, &settings).await,
        Command::Token {
            user,
            ttl_s,
            count,
            settings,
        } => {
            let jwt = Jwt::new(&settings.jwt_secret);
            let ttl = Duration::from_secs(ttl_s);
            for id in user..user.saturating_add(count) {
                println!("{}", jwt.mint(UserId::new(id), ttl)?);
            }
            Ok(())
        }
        Command::Pay { pay, settings } => {
            let answered = crate::payments::send::pay(pay, &settings).await?;
            return Ok(if answered {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
        Command::Rehearse {
            rehearsal,
            settings,
        } => {
            // A broken invariant is the answer, not an error: exit 1 after the report.
            let passed = crate::rehearsal::run(*rehearsal, settings).await?;
            return Ok(if passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
    }?;
    Ok(ExitCode::SUCCESS)
}

/// `seckill warmup ITEM`: loads the item with a progress bar, and prints the report.
async fn warmup(item: ItemId, force: bool, settings: &Settings) -> anyhow::Result<()> {
    let db = connect_mysql(settings.database_url.expose()).await?;
    migrate(&db).await?;
    // A warm-up settles loans between buckets, which waits for replicas as the server does.
    let redis = RedisConns::new(settings.redis_url.expose())?
        .waiting_for(WaitRule::from_settings(settings));
    // A rebuild asks RabbitMQ whether orders still wait in its queue.
    let broker = Broker::new(
        settings.amqp_url.expose(),
        Topology::new(&settings.namespace).with_queue_type(settings.queue_type),
    );
    let broker_stop = CancellationToken::new();
    let broker_task = tokio::spawn(broker.clone().run(broker_stop.clone()));
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} units ({eta})")
            .context("progress bar template")?
            .progress_chars("=> "),
    );
    bar.set_message(format!("item {item}"));
    bar.enable_steady_tick(Duration::from_millis(200));
    let warmup = Warmup {
        db: &db,
        redis: &redis,
        broker: &broker,
        keys: &Keys::new(&settings.namespace),
        plan: &Plan::from_settings(settings),
    };
    let report = warmup
        .run(item, force, &|progress| match progress {
            Progress::Waiting(why) => bar.set_message(format!("item {item}: {why}")),
            Progress::Loading { done, of } => {
                bar.set_message(format!("item {item}"));
                bar.set_length(of);
                bar.set_position(done);
            }
        })
        .await;
    bar.finish_and_clear();
    broker_stop.cancel();
    let _ = broker_task.await;
    let report = report?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// Cancels `shutdown` on SIGINT or SIGTERM.
async fn stop_on_signal(shutdown: CancellationToken) {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
    tracing::info!("shutdown requested: finishing in-flight work");
    shutdown.cancel();
}
