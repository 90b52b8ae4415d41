/* What the service manager is doing to this daemon's unit: its queued job, read over the system bus. */
#include "service-job.h"

#include <stdlib.h>
#include <string.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-login.h>

static ServiceJob job_type(const char *type)
{
        if (strcmp(type, "stop") == 0)
                return SERVICE_JOB_STOP;
        /* systemd turns try-restart and reload-or-restart into restart once it runs them */
        if (strcmp(type, "restart") == 0 || strcmp(type, "try-restart") == 0 ||
            strcmp(type, "reload-or-restart") == 0)
                return SERVICE_JOB_RESTART;
        return SERVICE_JOB_UNKNOWN;
}

ServiceJob service_job_query(unsigned long long timeout_usec)
{
        sd_bus_error err = SD_BUS_ERROR_NULL;
        sd_bus_message *reply = NULL;
        char *unit = NULL, *unit_path = NULL, *type = NULL;
        const char *job_path = NULL;
        ServiceJob j = SERVICE_JOB_UNKNOWN;
        sd_bus *bus = NULL;
        uint32_t job_id = 0;

        if (sd_pid_get_unit(0, &unit) < 0 || sd_bus_open_system(&bus) < 0)
                goto out;
        (void)sd_bus_set_method_call_timeout(bus, timeout_usec);
        if (sd_bus_path_encode("/org/freedesktop/systemd1/unit", unit, &unit_path) < 0)
                goto out;
        if (sd_bus_get_property(bus, "org.freedesktop.systemd1", unit_path, "org.freedesktop.systemd1.Unit",
                                "Job", &err, &reply, "(uo)") < 0 ||
            sd_bus_message_read(reply, "(uo)", &job_id, &job_path) < 0 || job_id == 0 || !job_path)
                goto out;
        if (sd_bus_get_property_string(bus, "org.freedesktop.systemd1", job_path,
                                       "org.freedesktop.systemd1.Job", "JobType", &err, &type) < 0)
                goto out;
        j = job_type(type);
out:
        free(type);
        sd_bus_message_unref(reply);
        sd_bus_error_free(&err);
        free(unit_path);
        free(unit);
        sd_bus_flush_close_unref(bus);
        return j;
}

const char *service_job_name(ServiceJob j)
{
        return j == SERVICE_JOB_STOP ? "stop" : j == SERVICE_JOB_RESTART ? "restart" : "unknown";
}
