//! One name, one job: two different handlers that fall back to one default name (`process`, in
//! two modules) would skip each other's work as done. Both are refused at their first call, with
//! both places named, and the key-space check reports them.

use idempotent_jobs::{Error, registry};

use crate::backends::Sqlite;
use crate::handlers::TestError;
use crate::harness::Db;

mod billing {
    use crate::handlers::{TestConn, TestError};

    #[idempotent_jobs::idempotent_job(key = "process:<id>")]
    pub fn process<C: TestConn>(conn: &mut C, id: i64) -> Result<(), TestError> {
        conn.insert_message("billing", &id.to_string())?;
        Ok(())
    }
}

mod shipping {
    use crate::handlers::{TestConn, TestError};

    #[idempotent_jobs::idempotent_job(key = "process:<id>")]
    pub fn process<C: TestConn>(conn: &mut C, id: i64) -> Result<(), TestError> {
        conn.insert_message("shipping", &id.to_string())?;
        Ok(())
    }
}

fn duplicate(result: Result<(), TestError>) -> (String, String) {
    match result {
        Err(TestError::Idempotent(Error::DuplicateJobName {
            name,
            first,
            second,
        })) => {
            assert_eq!(name, "process");
            (first, second)
        }
        other => panic!("expected DuplicateJobName, got {other:?}"),
    }
}

#[test]
fn two_handlers_with_one_default_name_are_refused() {
    let db = Db::<Sqlite>::fresh();
    let mut conn = db.connect();
    let (first, second) = duplicate(billing::process(&mut conn, 42));
    let places = format!("{first} {second}");
    assert!(places.contains("identity.rs:"), "{places}");
    assert_ne!(first, second);
    duplicate(shipping::process(&mut conn, 42));
    assert_eq!(
        <Sqlite as crate::backends::Backend>::count_messages(&mut conn),
        0,
        "neither body ran, and neither was silently skipped as done"
    );
    assert_eq!(
        <Sqlite as crate::backends::Backend>::count_done(&mut conn),
        0
    );

    let problems = registry::check_key_spaces().expect_err("the pair is reported");
    assert!(
        problems.iter().any(|p| matches!(
            p,
            registry::KeySpaceOverlap::SharedName { name, .. } if name == "process"
        )),
        "{problems:?}"
    );
}
