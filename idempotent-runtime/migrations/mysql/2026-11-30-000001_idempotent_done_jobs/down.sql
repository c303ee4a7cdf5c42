DROP TABLE done_jobs;
