//! Associated functions in `impl` blocks written inside a macro call (as `cfg_if!` takes them) or
//! inside a closure passed to a call: the attribute reads the block from the source file there
//! too, and gives them no companion. Before, it took them for free functions: five errors at the
//! attribute ("struct is not supported in `trait`s or `impl`s", ...) and no word of `no_companion`.
#![deny(warnings)]

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;
use std::sync::atomic::{AtomicU32, Ordering};

static RUNS: AtomicU32 = AtomicU32::new(0);

/// Its items, as written: what `cfg_if!` does with the branch it keeps.
macro_rules! items {
    ($($item:item)*) => { $($item)* };
}

/// Each branch's items, `cfg_if!`'s shape.
macro_rules! either {
    (if $condition:meta { $($then:item)* } else { $($otherwise:item)* }) => {
        #[cfg($condition)]
        items! { $($then)* }
        #[cfg(not($condition))]
        items! { $($otherwise)* }
    };
}

pub struct Invoices;

items! {
    impl Invoices {
        #[idempotent_job(key = "invoice:<id>")]
        pub fn send(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
            let _ = conn;
            RUNS.fetch_add(1, Ordering::SeqCst);
            Ok(id)
        }
    }
}

either! {
    if all() {
        impl Invoices {
            #[idempotent_job(key = "remind:<id>")]
            pub fn remind(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
                let _ = conn;
                RUNS.fetch_add(1, Ordering::SeqCst);
                Ok(id * 2)
            }
        }
    } else {
        impl Invoices {
            #[idempotent_job(key = "remind:<id>")]
            pub fn remind(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
                let _ = (conn, id);
                unreachable!("the other branch")
            }
        }
    }
}

fn main() {
    let ran = std::thread::spawn(move || {
        struct Worker;
        impl Worker {
            #[idempotent_job(key = "worker:<id>")]
            fn run(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
                let _ = conn;
                RUNS.fetch_add(1, Ordering::SeqCst);
                Ok(id + 1)
            }
        }
        let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
        idempotent_jobs::migrate(&mut conn).expect("migrations");
        (Worker::run(&mut conn, 1).expect("run"), Worker::run(&mut conn, 1).expect("replay"))
    })
    .join()
    .expect("the thread");
    assert_eq!(ran, (2, 2));
    let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
    idempotent_jobs::migrate(&mut conn).expect("migrations");
    for _ in 0..2 {
        assert_eq!(Invoices::send(&mut conn, 3).expect("send"), 3);
        assert_eq!(Invoices::remind(&mut conn, 3).expect("remind"), 6);
    }
    assert_eq!(RUNS.load(Ordering::SeqCst), 3, "each body ran once");
}
