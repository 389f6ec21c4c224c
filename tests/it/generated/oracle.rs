//! What each step of a history may answer, judged as it comes against what the history has
//! seen so far; and what the judge needs at the end (every `202`, every order named, every
//! buyer left unsure). A real server's timing decides which of two racing presses wins, so
//! a press is judged by the answers its moment allows, not by one predicted answer.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How long after a fault heals its traces may still be heard (`503 unavailable`, an
/// answer lost): a replica catching up, a restarted process's first second.
const SETTLING: Duration = Duration::from_secs(5);
/// How long an operator's change takes to reach every instance (the contract: a second),
/// with a margin: meanwhile the answers of before and after are both right.
const SPREADING: Duration = Duration::from_millis(2500);

/// A press's answer.
#[derive(Clone, Debug)]
pub struct Answer {
    /// 0: no answer came (the connection broke, or timed out).
    pub status: u16,
    pub code: String,
    pub order_sn: Option<String>,
    pub order_sns: Vec<String>,
}

impl Answer {
    pub fn label(&self) -> String {
        match &self.order_sn {
            Some(sn) => format!("{} {} {sn}", self.status, self.code),
            None => format!("{} {}", self.status, self.code),
        }
    }

    /// Whether the buyer cannot tell from it whether they won.
    fn unsure(&self) -> bool {
        self.status == 0 || self.status >= 500 && self.code == "unavailable" || self.status == 500
    }
}

/// The sale as the oracle judges a press against it.
pub struct Sale {
    pub ended: bool,
    /// A wave is still to come (or came within the margin memory uses).
    pub wave_ahead: bool,
    /// The record is a draw.
    pub draw: bool,
    /// The record has a waiting room.
    pub queued: bool,
}

#[derive(Default)]
pub struct Oracle {
    /// The largest `total` and `per_user` the record ever had (what the judge holds orders
    /// to: a lowered limit does not end orders taken before).
    pub total_max: u32,
    pub per_user_max: u8,
    /// The order each `Idempotency-Key` was answered with, by user and key.
    keys: HashMap<(u64, u8), String>,
    /// Every `202 queued`: the user and the order.
    pub won: Vec<(u64, String)>,
    /// Orders a `409` or a read named.
    pub named: HashSet<String>,
    /// Users who got an answer that cannot tell.
    pub unsure: HashSet<u64>,
    /// Orders a cancel was answered `200` for.
    pub cancelled: HashSet<String>,
    /// Users with a draw entry.
    pub entered: HashSet<u64>,
    pub paused: bool,
    pub circuit: u8,
    /// Until then, the traces of a fault may be heard.
    settling_until: Option<Instant>,
    /// Until then, an operator's change is still spreading.
    spreading_until: Option<Instant>,
    /// What the history did that the contract does not allow.
    pub violations: Vec<String>,
}

impl Oracle {
    pub fn new(total: u32, per_user: u8) -> Self {
        Self {
            total_max: total,
            per_user_max: per_user,
            ..Self::default()
        }
    }

    pub fn violation(&mut self, step: usize, what: String) {
        self.violations.push(format!("step {step}: {what}"));
    }

    /// The order `user`'s `key` was answered with before, if any.
    pub fn key_bought(&self, user: u64, key: Option<u8>) -> Option<&str> {
        self.keys.get(&(user, key?)).map(String::as_str)
    }

    /// A fault began or healed just now: its traces may be heard for a while.
    pub fn fault_moved(&mut self) {
        self.settling_until = Some(Instant::now() + SETTLING);
    }

    /// An operator's change was taken just now.
    pub fn changed(&mut self) {
        self.spreading_until = Some(Instant::now() + SPREADING);
    }

    /// Within [`SETTLING`] of a fault beginning or healing.
    pub fn settling(&self) -> bool {
        self.settling_until.is_some_and(|t| Instant::now() < t)
    }

    fn spreading(&self) -> bool {
        self.spreading_until.is_some_and(|t| Instant::now() < t)
    }

    /// Judges one press of `user` (with `key`) and notes what the judge needs. `faulty`: a
    /// fault is on now (a frozen replica, say).
    pub fn press(
        &mut self,
        step: usize,
        user: u64,
        key: Option<u8>,
        answer: &Answer,
        sale: &Sale,
        faulty: bool,
    ) {
        let trouble = faulty || self.settling();
        let spreading = self.spreading();
        if answer.unsure() {
            self.unsure.insert(user);
        }
        if let Some(sn) = &answer.order_sn
            && answer.status == 409
        {
            self.named.insert(sn.clone());
        }
        self.named.extend(answer.order_sns.iter().cloned());
        let allowed = match (answer.status, answer.code.as_str()) {
            (202, "queued") => match &answer.order_sn {
                Some(sn) => {
                    self.won.push((user, sn.clone()));
                    if let Some(key) = key {
                        let first = self.keys.entry((user, key)).or_insert_with(|| sn.clone());
                        if first != sn {
                            let first = first.clone();
                            self.violation(
                                step,
                                format!(
                                    "user {user}'s Idempotency-Key k{key} bought {first} and then {sn} (invariant 2)"
                                ),
                            );
                        }
                    }
                    !sale.draw || spreading
                }
                None => false,
            },
            (202 | 200, "entered") => {
                self.entered.insert(user);
                sale.draw || spreading
            }
            (409, "duplicate") => answer.order_sn.is_some(),
            (409, "limit_reached") => !answer.order_sns.is_empty(),
            (409, "between_releases") => sale.wave_ahead || spreading,
            (410, "sold_out") => true,
            (429, "rate_limited") => true,
            (403, "ended") => sale.ended || sale.draw || spreading,
            (503, "paused") => self.paused || spreading,
            // An instance's automatic breaker may trip on a fault's failures.
            (503, "circuit_open") => self.circuit > 0 || spreading || trouble,
            (503, "unavailable") | (0, _) => trouble || spreading,
            _ => false,
        };
        if !allowed {
            let faults = if trouble { "a fault on" } else { "no fault on" };
            self.violation(
                step,
                format!(
                    "user {user}'s press answered {} ({faults}, paused {}, breaker {}, ended {}, draw {})",
                    answer.label(),
                    self.paused,
                    self.circuit,
                    sale.ended,
                    sale.draw
                ),
            );
        }
        // A key answered with an order before is answered with it again, whatever else holds
        // (unless the buyer could not hear it: a fault).
        if let Some(key) = key
            && let Some(first) = self.keys.get(&(user, key))
            && answer.order_sn.as_ref() != Some(first)
            && !answer.unsure()
            && answer.status != 429
            && !sale.draw
            // A breaker at level 3 stops everything, a retried key too.
            && !(answer.code == "circuit_open" && (self.circuit == 3 || spreading))
        {
            let first = first.clone();
            self.violation(
                step,
                format!(
                    "user {user}'s Idempotency-Key k{key}, which bought {first}, answered {} (the contract: the same answer)",
                    answer.label()
                ),
            );
        }
    }
}
