/* A policy class's running state: its account, limits and counts (the data; classes.c keeps it). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "broker/broker.h"
#include "config/policy.h"

typedef struct ClassState {
        struct ClassState *next;
        char *name;
        const PolicyClass *klass; /* in the manager's current policy; NULL once a reload removed it */
        BrokerAccount acct;       /* limits and usage shared by every client of the class (its own lock) */
        uint64_t max_connections;
        uint64_t max_inflight; /* per connection; read by the loops without the lock */
        unsigned deny_ops;     /* copied from the class, so a class a reload removed keeps its rules too;
                                  read by the loops without the lock (READ_ONCE) */
        bool admin;
        unsigned connections;
        uint64_t denials;     /* atomic: counted where a request is refused, on any loop */
        uint64_t max_windows; /* VA windows its connections may hold at once (current and refused ones) */
} ClassState;
