/* Class state: the running side of policy classes (shared quota account, connections, in-flight requests). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "broker/broker.h"
#include "class-state.h"
#include "config/policy.h"

typedef struct Manager Manager;
typedef struct Conn Conn;

/* Make @p the running policy: states follow it by class name, every connection is matched again and its
 * usage moves with it. Takes ownership of @p. */
void classes_apply(Manager *m, Policy *p);
/* Bind a new connection to its class, or refuse it: -EACCES (no class admits it), -EUSERS (the class is at
 * its connection limit); @reason says which. */
int classes_admit(Manager *m, Conn *c, char *reason, size_t len);
/* The connection is gone. */
void classes_leave(Conn *c);
ClassState *classes_find(Manager *m, const char *name);
/* Administrator rights of @c: root, the daemon's uid, a member of admin-groups, or an admin class. */
bool classes_is_admin(const Manager *m, const Conn *c);
void classes_free_all(Manager *m);
/*
 * Runtime change of one limit (gpumemctl quota set): -EBUSY when the class uses more than @limit and
 * !@force; -EINVAL for a GPU this node lacks or a per-GPU limit of something else than VRAM.
 */
int classes_set_limit(Manager *m, ClassState *s, PolicyResource r, uint32_t gpu_id, uint64_t limit,
                      bool force, char *reason, size_t len);
/* Current usage of @r (per GPU when @gpu_id) and its limit. */
void classes_get(const Manager *m, ClassState *s, PolicyResource r, uint32_t gpu_id, uint64_t *ret_used,
                 uint64_t *ret_limit);
