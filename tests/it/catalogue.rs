//! A big sale day's set-up: operators' scripts creating and warming up many items at once.

use futures::StreamExt;
use serde_json::json;

use crate::helpers::*;

/// Eight operators' scripts at once on a fresh database, each creating items of shops no
/// one has seen (two scripts share each new shop) and warming each up right after, half
/// of them through a second instance: every `PUT` answers `201`, every warm-up `200`
/// (MySQL deadlocked some of these `PUT`s into `500`s, and their warm-ups into `404`s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_scripts_create_and_warm_up_items_without_failing_on_each_other() {
    let env = TestEnv::new("catalogue_scripts").await;
    let first = env.server(ALL_ROLES).await;
    let second = env.server(&[seckill::Role::Api]).await;
    let now = chrono::Utc::now();
    let scripts = futures::stream::iter(0..8u64).map(|script| {
        let env = &env;
        let (first, second) = (&first, &second);
        async move {
            let mut failures = Vec::new();
            for n in 0..25u64 {
                let id = 1_000 + script * 100 + n;
                let body = json!({
                    "name": format!("item {id}"),
                    "shop_id": 500 + script / 2 + n % 3,
                    "total": 10,
                    "start_at": now,
                    "end_at": now + chrono::Duration::hours(1),
                    "price_cents": 100,
                });
                let put = env
                    .admin(reqwest::Method::PUT, first, &format!("/admin/items/{id}"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                if put.status() != 201 {
                    failures.push(format!("PUT {id}: {}", put.status()));
                    continue;
                }
                let other = if n % 2 == 0 { first } else { second };
                let (status, json) = env
                    .admin_post(other, &format!("/admin/items/{id}/warmup"))
                    .await;
                if status != 200 {
                    failures.push(format!("warm-up {id}: {status} {json}"));
                }
            }
            failures
        }
    });
    let failures: Vec<String> = scripts
        .buffer_unordered(8)
        .flat_map(futures::stream::iter)
        .collect()
        .await;
    assert!(failures.is_empty(), "{failures:#?}");
    second.stop().await;
    first.stop().await;
}
