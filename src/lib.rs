#![doc = include_str!(concat!(env!("OUT_DIR"), "/README-docs.md"))]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc = include_str!("../docs/attribute.md")]
pub use idempotent_macros::idempotent_job;

pub use idempotent_runtime::*;

/// The guide: everything beyond the first job, one chapter per module. The chapters are the
/// markdown files under `docs/` in the repository; every code block in them is compiled (and, where
/// it needs no server, run) as a doctest.
///
/// * [Handlers and keys](crate::guide::handlers_and_keys): the attribute, key templates, the companion,
///   the plain function API, async handlers, pools, what a body must not do.
/// * [What a second run sees](crate::guide::second_run): fingerprints, stored results, expiry and
///   pruning, the guarantees and their limits, how a call works.
/// * [Effects beyond the database](crate::guide::outbox): the key as an idempotency key, the outbox.
/// * [Workers and brokers](crate::guide::workers_and_brokers): worker loops, redeliveries, RabbitMQ,
///   apalis, the fault tests, duplicates in progress, errors.
/// * [Operating it](crate::guide::operating): keys, the operator CLI, observability, migrations, security.
/// * [Running on a cluster](crate::guide::clusters): PostgreSQL failover, MariaDB Galera, PgBouncer.
/// * [Performance](crate::guide::performance): the benchmark and its figures.
/// * [Testing your jobs](crate::guide::testing): the test kit, and this crate's test suite.
pub mod guide {
    // build.rs writes these pages from `docs/*.md` (its `CHAPTERS` lists the same files), with
    // links between chapters turned into intra-doc links and images inlined.

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/handlers-and-keys.md"))]
    pub mod handlers_and_keys {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/second-run.md"))]
    pub mod second_run {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/outbox.md"))]
    pub mod outbox {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/workers-and-brokers.md"))]
    pub mod workers_and_brokers {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/operating.md"))]
    pub mod operating {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/clusters.md"))]
    pub mod clusters {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/performance.md"))]
    pub mod performance {}

    #[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/testing.md"))]
    pub mod testing {}
}
