use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(
    key = "reminder:<user_id>",
    name = "a_job_name_that_goes_on_and_on_past_what_the_done_jobs_table_of_mysql_can_hold_in_its_job_name_column_which_is_a_varchar_of_two_hundred_and_fifty_five_characters_so_that_a_session_without_a_strict_sql_mode_would_cut_it_short_and_make_its_own_runs_look_like_another_job"
)]
fn remind(conn: &mut SqliteConnection, user_id: u64) -> Result<(), idempotent_jobs::Error> {
    let _ = (conn, user_id);
    Ok(())
}

fn main() {}
