/* What the service manager is doing to this daemon's unit when it sends SIGTERM: a stop or a restart. */
#pragma once

typedef enum ServiceJob {
        SERVICE_JOB_UNKNOWN, /* not under systemd, no system bus, no job: the caller decides */
        SERVICE_JOB_STOP,    /* systemctl stop: nothing starts after this daemon */
        SERVICE_JOB_RESTART, /* restart, try-restart, reload-or-restart: the next daemon starts at once */
} ServiceJob;

/*
 * Ask systemd over the system bus for the job queued on this process's unit (Unit.Job, then Job.JobType),
 * waiting at most @timeout_usec. The daemon's SIGTERM is the same for a stop and a restart; the job is
 * what tells them apart. Never fails: SERVICE_JOB_UNKNOWN when it cannot tell.
 */
ServiceJob service_job_query(unsigned long long timeout_usec);
/* "stop", "restart" or "unknown". */
const char *service_job_name(ServiceJob j);
