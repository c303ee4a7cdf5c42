//! What the explorer generates and records: schedules (from a seed), the history of a run, what the
//! database held at its end, and the checker that compares them.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Attempts after which the relay parks a message.
pub const MAX_ATTEMPTS: u32 = 4;

/// Allowance for the databases' clocks: SQLite's stored times have milliseconds.
pub const TOLERANCE_US: i64 = 5_000;

/// The jobs, by index: how long their keys hold (`None`: for ever).
pub const KEEPS: [Option<u64>; 4] = [None, Some(1), Some(2), Some(3)];

// ---- a seeded generator --------------------------------------------------------------------------

/// splitmix64: small, fast, and the same on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5eed_0fe8_910e_u64)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// `true` with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Db {
    Sqlite,
    Postgres,
    Mariadb,
}

impl Db {
    pub fn name(self) -> &'static str {
        match self {
            Db::Sqlite => "sqlite",
            Db::Postgres => "postgres",
            Db::Mariadb => "mariadb",
        }
    }

    pub fn is_server(self) -> bool {
        self != Db::Sqlite
    }

    /// The session settings a worker's connections make right after connecting, taking turns by
    /// `turn` (the worker's slot and start): settings of a user's own that the README lists as
    /// supported, under which every check must hold as it does without them.
    pub fn session_settings(self, turn: u64) -> &'static str {
        let settings: &[&'static str] = match self {
            Db::Sqlite => &[
                "",
                // A page cache that spills to the database file in the middle of a transaction.
                "PRAGMA cache_size = 8",
                "PRAGMA synchronous = OFF; PRAGMA temp_store = MEMORY",
            ],
            Db::Postgres => &[
                "",
                "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
                "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ",
                "SET TIME ZONE 'Pacific/Kiritimati'",
            ],
            Db::Mariadb => &[
                "",
                "SET SESSION completion_type = 'CHAIN'",
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
                "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE",
                "SET SESSION sql_mode = ''; SET time_zone = '-11:00'",
                // Every statement that touches a table opens a transaction the session holds.
                "SET SESSION autocommit = 0",
            ],
        };
        settings[(turn % settings.len() as u64) as usize]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    Sync,
    Async,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fail {
    No,
    /// The body does its work, then returns `Err`.
    Err,
    /// The body does its work, then panics.
    Panic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HoldPoint {
    /// Inside the job's transaction, after the work (the effect row, the outbox push).
    Body,
    /// After the call returned (committed), before the worker reports it: before the "ack".
    AfterCommit,
}

/// What the nemesis does to a worker held at a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Nemesis {
    /// Nothing: the worker goes on.
    Go,
    /// SIGKILL.
    Kill,
    /// SIGSTOP for `ms` (past the job's keep), then SIGCONT and go on; the schedule goes on
    /// meanwhile.
    StopFor { ms: u64 },
    /// pg_terminate_backend / MariaDB KILL of the worker's connection, then go on.
    Terminate,
    /// Cut the worker's TCP connections (through its proxy), then go on.
    Cut,
    /// Go on; after the worker's next `after` writes the proxy drops the server's replies, and
    /// 300 ms later it cuts: a statement (the record, the commit) whose reply is lost.
    LoseReplies { after: u32 },
    /// Go on while the proxy forwards nothing for `ms`.
    Stall { ms: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub at: HoldPoint,
    pub then: Nemesis,
}

/// One delivery of a job to a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// The run id: unique per delivery; the effect row and the stored result carry it.
    pub id: String,
    pub key: String,
    /// Index into [`KEEPS`].
    pub job: u8,
    pub redelivered: bool,
    /// The fingerprint input, when the delivery carries one.
    pub fp: Option<u64>,
    /// The job stores no result (`None` → JSON null).
    pub null_result: bool,
    /// Push an outbox message whose first `poison` deliveries fail.
    pub outbox: Option<u32>,
    pub fail: Fail,
    /// The body sleeps this long after its work.
    pub slow_ms: u64,
    pub hold: Option<Hold>,
    /// Async workers: drop the call's future after this long.
    pub cancel_ms: Option<u64>,
    /// While another run of the key is in progress: `None` waits (the default), `Some(0)` fails at
    /// once, `Some(ms)` waits at most that long (`WhileInProgress`).
    #[serde(default)]
    pub in_progress_ms: Option<u64>,
    /// The job is called inside a transaction of the caller's (Diesel's `transaction`), which
    /// commits when the call returns `Ran` or `Replayed` and rolls back on anything else: the
    /// job runs in a savepoint of it.
    #[serde(default)]
    pub nested: bool,
}

/// What an operator does beside the workers, through the runtime's API or the CLI binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operation {
    /// `outbox::retry_parked(conn, None)`: every parked message back to the relays.
    RetryParked,
    /// `outbox::prune_delivered(conn, 0 s, unpaced)`: delete every delivered message.
    PruneDelivered,
    /// `idempotent-jobs prune --pace 0`.
    CliPrune,
    /// `idempotent-jobs outbox retry --all`.
    CliRetryParked,
    /// `idempotent-jobs verify`: reading only, it must find the tables present and usable.
    CliVerify,
    /// `idempotent-jobs keys list --json` and `outbox pending --json`, reading only.
    CliList,
}

impl Operation {
    pub const ALL: [Operation; 6] = [
        Operation::RetryParked,
        Operation::PruneDelivered,
        Operation::CliPrune,
        Operation::CliRetryParked,
        Operation::CliVerify,
        Operation::CliList,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Operation::RetryParked => "retry-parked",
            Operation::PruneDelivered => "prune-delivered",
            Operation::CliPrune => "prune-cli",
            Operation::CliRetryParked => "retry-parked-cli",
            Operation::CliVerify => "verify-cli",
            Operation::CliList => "list-cli",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Step {
    Deliver {
        w: usize,
        job: JobSpec,
    },
    /// A relay round on worker `w`; held after its `hold_at`-th delivery (counted from 1), then
    /// `then`; an async worker's relay is dropped after `cancel_ms`.
    Relay {
        w: usize,
        hold_at: Option<u32>,
        then: Nemesis,
        cancel_ms: Option<u64>,
    },
    Prune,
    /// Forget a key through the keys API, or through the CLI binary (`idempotent-jobs keys
    /// forget`) when `cli` and the binary is built.
    Forget {
        key: String,
        #[serde(default)]
        cli: bool,
    },
    Sleep {
        ms: u64,
    },
    /// An operator's command beside the workers.
    Operate {
        op: Operation,
    },
    /// Crash the database server (SIGKILL to every process of it) and start it again on its data:
    /// PostgreSQL and MariaDB, on a server of the explorer's own, started for a schedule that has
    /// this step.
    RestartServer,
    /// SIGKILL worker `w` whatever it is doing, and start it again.
    Kill {
        w: usize,
    },
    Cut {
        w: usize,
    },
    Stall {
        w: usize,
        ms: u64,
    },
    /// Start worker `w` again, with its clock skewed by libfaketime (`"+2h"`, `"-30m"`).
    Restart {
        w: usize,
        skew: Option<String>,
    },
}

impl Step {
    /// The fault this step is, for the figures (`None`: a plain delivery or pause).
    pub fn fault(&self) -> Option<String> {
        let nemesis = |n: &Nemesis| match n {
            Nemesis::Go => None,
            Nemesis::Kill => Some("kill"),
            Nemesis::StopFor { .. } => Some("stop-past-keep"),
            Nemesis::Terminate => Some("terminate-connection"),
            Nemesis::Cut => Some("cut-tcp"),
            Nemesis::LoseReplies { .. } => Some("lose-replies-then-cut"),
            Nemesis::Stall { .. } => Some("stall-tcp"),
        };
        match self {
            Step::Deliver { job, .. } => {
                let mut kinds = Vec::new();
                if let Some(hold) = job.hold
                    && let Some(kind) = nemesis(&hold.then)
                {
                    kinds.push(match (hold.at, kind) {
                        (HoldPoint::AfterCommit, "kill") => {
                            "kill-between-commit-and-ack".to_owned()
                        }
                        (HoldPoint::Body, "kill") => "kill-in-transaction".to_owned(),
                        (_, kind) => kind.to_owned(),
                    });
                }
                if job.cancel_ms.is_some() {
                    kinds.push("drop-async-future".to_owned());
                }
                if job.fail == Fail::Err {
                    kinds.push("body-err".to_owned());
                }
                if job.fail == Fail::Panic {
                    kinds.push("body-panic".to_owned());
                }
                (!kinds.is_empty()).then(|| kinds.join("+"))
            }
            Step::Relay {
                hold_at,
                then,
                cancel_ms,
                ..
            } => {
                if cancel_ms.is_some() {
                    Some("cancel-relay".to_owned())
                } else if hold_at.is_some() && *then == Nemesis::Kill {
                    Some("kill-relay-mid-delivery".to_owned())
                } else {
                    None
                }
            }
            Step::Prune => Some("prune".to_owned()),
            Step::Forget { cli: false, .. } => Some("forget".to_owned()),
            Step::Forget { cli: true, .. } => Some("forget-cli".to_owned()),
            Step::Sleep { .. } => None,
            Step::Operate { op } => Some(op.label().to_owned()),
            Step::RestartServer => Some("restart-server".to_owned()),
            Step::Kill { .. } => Some("kill-at-random".to_owned()),
            Step::Cut { .. } => Some("cut-tcp-at-random".to_owned()),
            Step::Stall { .. } => Some("stall-tcp-at-random".to_owned()),
            Step::Restart { skew: Some(_), .. } => Some("restart-with-skewed-clock".to_owned()),
            Step::Restart { skew: None, .. } => Some("restart".to_owned()),
        }
    }
}

/// A database's schedule: its workers and its steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    pub db: Db,
    pub seed: u64,
    pub modes: Vec<Mode>,
    pub steps: Vec<Step>,
}

struct KeyInfo {
    key: String,
    job: u8,
    fp: u64,
    null_result: bool,
}

/// Draws the steps of one database's schedule from a seed: the same seed, the same steps.
pub struct Generator {
    rng: Rng,
    db: Db,
    pub modes: Vec<Mode>,
    next_id: u64,
    keys: Vec<KeyInfo>,
}

/// The seed of one database's schedule, from the run's seed.
pub fn db_seed(seed: u64, db: Db) -> u64 {
    let mut rng = Rng::new(seed.wrapping_add(db as u64 * 0x1000_0001));
    rng.next_u64()
}

impl Generator {
    pub fn new(seed: u64, db: Db) -> Self {
        let mut rng = Rng::new(db_seed(seed, db));
        let third = if rng.chance(50) {
            Mode::Sync
        } else {
            Mode::Async
        };
        Generator {
            rng,
            db,
            modes: vec![Mode::Sync, Mode::Async, third],
            next_id: 0,
            keys: Vec::new(),
        }
    }

    pub fn schedule(seed: u64, db: Db, steps: usize) -> Schedule {
        let mut generator = Generator::new(seed, db);
        let steps = (0..steps).map(|_| generator.step()).collect();
        Schedule {
            db,
            seed,
            modes: generator.modes,
            steps,
        }
    }

    fn worker(&mut self) -> usize {
        self.rng.below(self.modes.len() as u64) as usize
    }

    fn nemesis(&mut self, keep_ms: u64) -> Nemesis {
        let server = self.db.is_server();
        match self.rng.below(if server { 8 } else { 4 }) {
            0 => Nemesis::Go,
            1 => Nemesis::Kill,
            2 | 3 => Nemesis::StopFor {
                ms: keep_ms + self.rng.range(200, 700),
            },
            4 => Nemesis::Terminate,
            5 => Nemesis::Cut,
            6 => Nemesis::LoseReplies {
                after: self.rng.range(0, 6) as u32,
            },
            _ => Nemesis::Stall {
                ms: self.rng.range(100, 1500),
            },
        }
    }

    fn job(&mut self, w: usize) -> JobSpec {
        let fresh = self.keys.is_empty() || self.rng.chance(35);
        let index = if fresh {
            let job = self.rng.below(KEEPS.len() as u64) as u8;
            let n = self.keys.len();
            self.keys.push(KeyInfo {
                key: format!("explore:{job}:k{n}"),
                job,
                fp: self.rng.below(1_000),
                null_result: self.rng.chance(20),
            });
            n
        } else if self.rng.chance(70) {
            let recent = self.keys.len().min(12) as u64;
            self.keys.len() - 1 - self.rng.below(recent) as usize
        } else {
            self.rng.below(self.keys.len() as u64) as usize
        };
        let (key, job, fp, null_result) = {
            let k = &self.keys[index];
            (k.key.clone(), k.job, k.fp, k.null_result)
        };
        self.next_id += 1;
        let fp = match self.rng.below(10) {
            0..=5 => Some(fp),
            6 => Some(fp + 1),
            _ => None,
        };
        let outbox = self.rng.chance(40).then(|| match self.rng.below(20) {
            0..=15 => 0,
            16..=18 => self.rng.range(1, 2) as u32,
            _ => MAX_ATTEMPTS,
        });
        let fail = match self.rng.below(100) {
            0..=7 => Fail::Err,
            8..=12 => Fail::Panic,
            _ => Fail::No,
        };
        let slow_ms = if self.rng.chance(20) {
            self.rng.range(1, 300)
        } else {
            0
        };
        let keep_ms = KEEPS[job as usize].map_or(1_000, |s| s * 1_000);
        let hold = self.rng.chance(16).then(|| {
            if self.rng.chance(30) {
                Hold {
                    at: HoldPoint::AfterCommit,
                    then: if self.rng.chance(80) {
                        Nemesis::Kill
                    } else {
                        Nemesis::Go
                    },
                }
            } else {
                Hold {
                    at: HoldPoint::Body,
                    then: self.nemesis(keep_ms),
                }
            }
        });
        let cancel_ms = (hold.is_none() && self.modes[w] == Mode::Async && self.rng.chance(8))
            .then(|| self.rng.range(5, 300));
        let in_progress_ms = (!fresh && self.rng.chance(15)).then(|| {
            if self.rng.chance(40) {
                0
            } else {
                self.rng.range(10, 1500)
            }
        });
        let nested = self.rng.chance(20);
        JobSpec {
            in_progress_ms,
            nested,
            id: format!("d{}", self.next_id),
            key,
            job,
            redelivered: if fresh {
                self.rng.chance(5)
            } else {
                self.rng.chance(50)
            },
            fp,
            null_result,
            outbox,
            fail,
            slow_ms,
            hold,
            cancel_ms,
        }
    }

    pub fn step(&mut self) -> Step {
        let server = self.db.is_server();
        let roll = self.rng.below(100);
        match roll {
            0..=61 => {
                let w = self.worker();
                Step::Deliver {
                    w,
                    job: self.job(w),
                }
            }
            70 if server => Step::RestartServer,
            62..=70 => Step::Sleep {
                ms: self.rng.range(5, 200),
            },
            71..=73 => Step::Operate {
                op: Operation::ALL[self.rng.below(Operation::ALL.len() as u64) as usize],
            },
            74..=80 => {
                let w = self.worker();
                let async_worker = self.modes[w] == Mode::Async;
                if async_worker && self.rng.chance(25) {
                    Step::Relay {
                        w,
                        hold_at: None,
                        then: Nemesis::Go,
                        cancel_ms: Some(self.rng.range(5, 150)),
                    }
                } else {
                    let hold_at = self.rng.chance(50).then(|| self.rng.range(1, 4) as u32);
                    Step::Relay {
                        w,
                        hold_at,
                        then: if self.rng.chance(70) {
                            Nemesis::Kill
                        } else {
                            Nemesis::Go
                        },
                        cancel_ms: None,
                    }
                }
            }
            81..=83 => Step::Prune,
            84..=87 if !self.keys.is_empty() => {
                let recent = self.keys.len().min(12) as u64;
                let index = self.keys.len() - 1 - self.rng.below(recent) as usize;
                Step::Forget {
                    key: self.keys[index].key.clone(),
                    cli: self.rng.chance(30),
                }
            }
            88..=91 => Step::Kill { w: self.worker() },
            92..=94 => {
                let w = self.worker();
                let skew = if server {
                    match self.rng.below(10) {
                        0..=4 => Some("+2h".to_owned()),
                        5..=7 => Some("-30m".to_owned()),
                        _ => None,
                    }
                } else {
                    None
                };
                Step::Restart { w, skew }
            }
            95..=96 if server => Step::Cut { w: self.worker() },
            97..=99 if server => Step::Stall {
                w: self.worker(),
                ms: self.rng.range(100, 1500),
            },
            _ => Step::Sleep {
                ms: self.rng.range(5, 50),
            },
        }
    }
}

// ---- the history ---------------------------------------------------------------------------------

/// How a delivery ended, as its worker reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Res {
    Ran(Option<String>),
    Replayed(Option<String>),
    /// The runtime's error, with what it claims.
    Error {
        variant: String,
        text: String,
        retryable: bool,
        nothing_committed: bool,
    },
    /// The body returned `Err` (after its work): rolled back.
    BodyErr,
    /// A statement of the body failed and the body returned its error: rolled back.
    BodyDbErr(String),
    /// The body panicked (after its work): rolled back.
    Panicked,
    /// The worker could not connect; nothing ran.
    NoConnection(String),
    /// The async call's future was dropped: unknown.
    Cancelled,
    /// The worker was killed before it reported: unknown.
    Unknown(String),
}

impl Res {
    /// The delivery claims that nothing of its run was committed.
    pub fn claims_nothing_committed(&self) -> bool {
        match self {
            Res::Error {
                nothing_committed, ..
            } => *nothing_committed,
            Res::BodyErr | Res::BodyDbErr(_) | Res::Panicked | Res::NoConnection(_) => true,
            _ => false,
        }
    }

    pub fn completed(&self) -> bool {
        matches!(self, Res::Ran(_) | Res::Replayed(_))
    }

    pub fn label(&self) -> String {
        match self {
            Res::Ran(_) => "ran".into(),
            Res::Replayed(_) => "replayed".into(),
            Res::Error { variant, .. } => format!("error:{variant}"),
            Res::BodyErr => "body-err".into(),
            Res::BodyDbErr(_) => "body-db-err".into(),
            Res::Panicked => "panicked".into(),
            Res::NoConnection(_) => "no-connection".into(),
            Res::Cancelled => "cancelled".into(),
            Res::Unknown(_) => "unknown".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub id: String,
    pub key: String,
    pub job: u8,
    pub worker: usize,
    pub final_round: bool,
    pub null_result: bool,
    pub res: Res,
    /// When the controller sent the job to its worker, and when the outcome came back (or the
    /// worker was killed), µs since the epoch on the controller's clock.
    #[serde(default)]
    pub start_us: i64,
    #[serde(default)]
    pub end_us: i64,
}

/// A forget through the keys API: when it started and ended (µs since the epoch) and whether it
/// found a row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forget {
    pub key: String,
    pub start_us: i64,
    pub end_us: i64,
    pub found: bool,
    /// The forget failed (then the row may be gone or not, and `found` is `true`).
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub deliveries: Vec<Delivery>,
    pub forgets: Vec<Forget>,
    /// Message ids as the receiver (the relay's delivery function) got them, duplicates included.
    pub received: Vec<String>,
    /// What the explorer itself could not do (a worker that hung, a final relay that never
    /// drained), each a violation.
    pub anomalies: Vec<String>,
}

/// One committed effect row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Effect {
    pub key: String,
    pub run_id: String,
    pub result: Option<String>,
    pub at_us: i64,
    pub msg_id: Option<String>,
}

/// What the database held at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    pub effects: Vec<Effect>,
    /// Every outbox row's message id.
    pub outbox_ids: Vec<String>,
    /// Parked messages with their attempts.
    pub parked: Vec<(String, u32)>,
    /// Messages neither delivered nor parked after the final drain.
    pub unsent: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub kind: &'static str,
    pub key: Option<String>,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.key {
            Some(key) => write!(f, "[{}] key {key}: {}", self.kind, self.detail),
            None => write!(f, "[{}] {}", self.kind, self.detail),
        }
    }
}

/// What the checker found and how much it looked at.
#[derive(Debug, Default)]
pub struct Verdict {
    pub violations: Vec<Violation>,
    pub checks: BTreeMap<&'static str, u64>,
}

impl Verdict {
    fn check(&mut self, kind: &'static str) {
        *self.checks.entry(kind).or_default() += 1;
    }

    fn fail(&mut self, kind: &'static str, key: Option<&str>, detail: String) {
        self.violations.push(Violation {
            kind,
            key: key.map(str::to_owned),
            detail,
        });
    }
}

fn expected_value(id: &str, null_result: bool) -> Option<String> {
    (!null_result).then(|| format!("res:{id}"))
}

/// Compares the history with what the database held; see docs/explore.md for each rule.
pub fn check(history: &History, observed: &Observed) -> Verdict {
    let mut v = Verdict::default();
    for anomaly in &history.anomalies {
        v.fail("explorer-anomaly", None, anomaly.clone());
    }
    let job_of: BTreeMap<&str, u8> = history
        .deliveries
        .iter()
        .map(|d| (d.key.as_str(), d.job))
        .collect();
    let mut effects_by_key: BTreeMap<&str, Vec<&Effect>> = BTreeMap::new();
    let mut effect_by_run: BTreeMap<&str, &Effect> = BTreeMap::new();
    for e in &observed.effects {
        effects_by_key.entry(&e.key).or_default().push(e);
        if let Some(other) = effect_by_run.insert(&e.run_id, e) {
            v.fail(
                "one-effect-per-run",
                Some(&e.key),
                format!(
                    "run {} committed two effect rows ({other:?}, {e:?})",
                    e.run_id
                ),
            );
        }
    }
    let delivered: BTreeMap<&str, &Delivery> = history
        .deliveries
        .iter()
        .map(|d| (d.id.as_str(), d))
        .collect();

    // Effects: one per keep window; a forget that found the row opens a new window.
    for (key, effects) in &mut effects_by_key {
        effects.sort_by_key(|e| e.at_us);
        v.check("effect-has-a-delivery");
        for e in effects.iter() {
            match delivered.get(e.run_id.as_str()) {
                None => v.fail(
                    "effect-has-a-delivery",
                    Some(key),
                    format!("effect of run {} that no delivery started", e.run_id),
                ),
                Some(d) if d.key != *key => v.fail(
                    "effect-has-a-delivery",
                    Some(key),
                    format!("run {} was a delivery of key {}", e.run_id, d.key),
                ),
                Some(_) => {}
            }
            if e.result != expected_value(&e.run_id, e.result.is_none()) {
                v.fail(
                    "effect-has-a-delivery",
                    Some(key),
                    format!("run {} wrote result {:?}", e.run_id, e.result),
                );
            }
        }
        let keep_us = job_of
            .get(key)
            .and_then(|job| KEEPS[*job as usize])
            .map(|s| s as i64 * 1_000_000);
        for pair in effects.windows(2) {
            let (first, second) = (pair[0], pair[1]);
            v.check("one-effect-per-window");
            let lapsed =
                keep_us.is_some_and(|keep| second.at_us - first.at_us >= keep - TOLERANCE_US);
            let forgotten = history.forgets.iter().any(|f| {
                f.key == *key
                    && f.found
                    && f.end_us >= first.at_us - TOLERANCE_US
                    && f.start_us <= second.at_us + TOLERANCE_US
            });
            if !lapsed && !forgotten {
                v.fail(
                    "one-effect-per-window",
                    Some(key),
                    format!(
                        "runs {} and {} both committed, {:.3} s apart, within one window (keep {}) with no forget between",
                        first.run_id,
                        second.run_id,
                        (second.at_us - first.at_us) as f64 / 1e6,
                        keep_us.map_or("for ever".to_owned(), |k| format!("{} s", k / 1_000_000)),
                    ),
                );
            }
        }
    }

    // Each delivery's claim against the database.
    for d in &history.deliveries {
        let key = Some(d.key.as_str());
        if matches!(d.res, Res::Error { .. }) {
            v.check("errors-name-what-happened");
        }
        match &d.res {
            Res::Ran(value) => {
                v.check("ran-is-committed");
                match effect_by_run.get(d.id.as_str()) {
                    Some(e) if e.key == d.key => {}
                    _ => v.fail(
                        "ran-is-committed",
                        key,
                        format!(
                            "delivery {} reported Ran, but no effect of run {} is committed",
                            d.id, d.id
                        ),
                    ),
                }
                v.check("ran-returns-its-value");
                if *value != expected_value(&d.id, d.null_result) {
                    v.fail(
                        "ran-returns-its-value",
                        key,
                        format!("delivery {} ran and returned {value:?}", d.id),
                    );
                }
            }
            Res::Replayed(value) => {
                v.check("replay-returns-a-committed-result");
                if effect_by_run.contains_key(d.id.as_str()) {
                    v.fail(
                        "replay-returns-a-committed-result",
                        key,
                        format!(
                            "delivery {} reported Replayed, yet its run's effect is committed",
                            d.id
                        ),
                    );
                }
                match value {
                    Some(text) => {
                        let run = text.strip_prefix("res:").unwrap_or(text);
                        match effect_by_run.get(run) {
                            Some(e) if e.key == d.key && run != d.id => {
                                v.check("replay-returns-the-latest-window");
                                if let Some(newer) = newer_run_done_before(
                                    d,
                                    e,
                                    &effects_by_key,
                                    &delivered,
                                ) {
                                    v.fail(
                                        "replay-returns-the-latest-window",
                                        key,
                                        format!(
                                            "delivery {} replayed run {run}, but run {newer} of a later window had committed (and reported Ran) before the delivery began",
                                            d.id
                                        ),
                                    );
                                }
                            }
                            _ => v.fail(
                                "replay-returns-a-committed-result",
                                key,
                                format!(
                                    "delivery {} replayed {text:?}, which is no committed run of this key",
                                    d.id
                                ),
                            ),
                        }
                    }
                    None => {
                        if !d.null_result {
                            v.fail(
                                "replay-returns-a-committed-result",
                                key,
                                format!(
                                    "delivery {} replayed null for a job that stores results",
                                    d.id
                                ),
                            );
                        } else if !effects_by_key.contains_key(d.key.as_str()) {
                            v.fail(
                                "replay-returns-a-committed-result",
                                key,
                                format!(
                                    "delivery {} replayed, but no run of the key is committed",
                                    d.id
                                ),
                            );
                        }
                    }
                }
            }
            Res::Error { variant, .. }
                if matches!(variant.as_str(), "ClaimNotTakenBack" | "CannotRollBack") =>
            {
                // The explorer's bodies never end their transaction, nor write where a rollback
                // cannot reach: an alarm that asks an operator to forget a key is a false one.
                v.fail(
                    "errors-name-what-happened",
                    key,
                    format!(
                        "delivery {} reported {:?}, but no body here ends its transaction or writes where a rollback cannot reach",
                        d.id, d.res
                    ),
                );
            }
            res if res.claims_nothing_committed() => {
                v.check("nothing-committed-means-nothing");
                if let Some(e) = effect_by_run.get(d.id.as_str()) {
                    v.fail(
                        "nothing-committed-means-nothing",
                        key,
                        format!(
                            "delivery {} reported {res:?} (nothing committed), but its effect is committed: {e:?}",
                            d.id
                        ),
                    );
                }
            }
            _ => {}
        }
    }

    // The final round: every key's last delivery completed.
    let mut last_final: BTreeMap<&str, &Delivery> = BTreeMap::new();
    for d in history.deliveries.iter().filter(|d| d.final_round) {
        last_final.insert(&d.key, d);
    }
    let keys: BTreeSet<&str> = history.deliveries.iter().map(|d| d.key.as_str()).collect();
    for key in keys {
        v.check("no-key-stuck");
        match last_final.get(key) {
            None => v.fail(
                "no-key-stuck",
                Some(key),
                "the final round never delivered it".into(),
            ),
            Some(d) if !d.res.completed() => v.fail(
                "no-key-stuck",
                Some(key),
                format!("its final delivery {} ended {:?}", d.id, d.res),
            ),
            Some(_) => {}
        }
    }

    // The outbox.
    let committed_msgs: BTreeMap<&str, &Effect> = observed
        .effects
        .iter()
        .filter_map(|e| e.msg_id.as_deref().map(|m| (m, e)))
        .collect();
    let received: BTreeSet<&str> = history.received.iter().map(String::as_str).collect();
    let parked: BTreeMap<&str, u32> = observed
        .parked
        .iter()
        .map(|(m, a)| (m.as_str(), *a))
        .collect();
    for (msg, e) in &committed_msgs {
        v.check("committed-message-delivered");
        if !received.contains(msg) && !parked.contains_key(msg) {
            v.fail(
                "committed-message-delivered",
                Some(&e.key),
                format!(
                    "message {msg} of run {} was committed but never delivered nor parked{}",
                    e.run_id,
                    if observed.unsent.iter().any(|u| u == msg) {
                        " (still unsent after the final drain)"
                    } else {
                        ""
                    }
                ),
            );
        }
    }
    for msg in &received {
        v.check("delivered-message-was-committed");
        if !committed_msgs.contains_key(msg) {
            v.fail(
                "delivered-message-was-committed",
                None,
                format!("message {msg} was delivered, but no committed run pushed it"),
            );
        }
    }
    for msg in &observed.outbox_ids {
        v.check("outbox-row-was-committed-with-its-job");
        if !committed_msgs.contains_key(msg.as_str()) {
            v.fail(
                "outbox-row-was-committed-with-its-job",
                None,
                format!("outbox row {msg} exists, but no committed run pushed it"),
            );
        }
    }
    for (msg, attempts) in &parked {
        v.check("parked-only-when-attempts-spent");
        if *attempts < MAX_ATTEMPTS {
            v.fail(
                "parked-only-when-attempts-spent",
                None,
                format!("message {msg} was parked after {attempts} of {MAX_ATTEMPTS} attempts"),
            );
        }
    }
    v
}

/// A run of `replayed`'s key from a later window than `replayed` whose delivery reported `Ran`
/// before `d` was sent: the key's row then held that run, so `d` could not have read `replayed`.
fn newer_run_done_before<'a>(
    d: &Delivery,
    replayed: &Effect,
    effects_by_key: &BTreeMap<&str, Vec<&Effect>>,
    delivered: &BTreeMap<&str, &'a Delivery>,
) -> Option<&'a str> {
    effects_by_key
        .get(d.key.as_str())?
        .iter()
        .filter(|e| e.at_us > replayed.at_us)
        .filter_map(|e| delivered.get(e.run_id.as_str()))
        .find(|newer| {
            matches!(newer.res, Res::Ran(_)) && newer.end_us > 0 && newer.end_us < d.start_us
        })
        .map(|newer| newer.id.as_str())
}

/// Shortens a violation for matching during shrinking: its kind.
pub fn signature(violations: &[Violation]) -> BTreeSet<&'static str> {
    violations.iter().map(|v| v.kind).collect()
}
