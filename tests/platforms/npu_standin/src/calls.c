/* Call counts, tracing, the recent error message and configuration. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

#define TABLE_SIZE 8192 /* more than the generated names */
#define ACLNN_ERR_INNER 561000

struct counter {
    const char *name; /* a string literal: __func__ or a generated name */
    uint64_t calls;
};

static struct counter table[TABLE_SIZE];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local char pending_error[512];
static _Thread_local char reported_error[512];

static uint64_t hash(const char *name)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *name; ++name)
        h = (h ^ (unsigned char)*name) * 1099511628211ULL;
    return h;
}

/* The slot of NAME, claimed if ADD; NULL when absent. Lock held. */
static struct counter *slot(const char *name, int add)
{
    uint64_t at = hash(name) % TABLE_SIZE;
    for (uint64_t probes = 0; probes < TABLE_SIZE; ++probes, at = (at + 1) % TABLE_SIZE) {
        if (table[at].name == NULL) {
            if (!add)
                return NULL;
            table[at].name = name;
            return &table[at];
        }
        if (strcmp(table[at].name, name) == 0)
            return &table[at];
    }
    return NULL;
}

static int trace_level(void)
{
    static int level = -1;
    if (level < 0)
        level = (int)standin_env_u64("NPU_STANDIN_TRACE", 0);
    return level;
}

void standin_count(const char *name)
{
    pthread_mutex_lock(&table_lock);
    struct counter *c = slot(name, 1);
    uint64_t calls = c ? ++c->calls : 0;
    pthread_mutex_unlock(&table_lock);
    if (trace_level() > 1 || (trace_level() == 1 && calls == 1))
        fprintf(stderr, "npu_standin: %s\n", name);
}

int64_t standin_stub_called(const char *name)
{
    standin_count(name);
    return 0;
}

int64_t standin_unimplemented(const char *name)
{
    standin_count(name);
    standin_set_error("npu_standin: %s is not implemented by the stand-in CANN runtime (tests/platforms/npu_standin)", name);
    fprintf(stderr, "%s\n", pending_error);
    return ACLNN_ERR_INNER;
}

void standin_set_error(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(pending_error, sizeof pending_error, fmt, args);
    va_end(args);
}

uint64_t standin_env_u64(const char *name, uint64_t fallback)
{
    const char *text = getenv(name);
    if (text == NULL || *text == '\0')
        return fallback;
    return strtoull(text, NULL, 0);
}

const char *aclGetRecentErrMsg(void)
{
    STANDIN_CALLED();
    memcpy(reported_error, pending_error, sizeof reported_error);
    pending_error[0] = '\0';
    return reported_error;
}

/* Test control: how many times the runtime saw a call of NAME. */
STANDIN_EXPORT uint64_t standin_call_count(const char *name)
{
    pthread_mutex_lock(&table_lock);
    struct counter *c = slot(name, 0);
    uint64_t calls = c ? c->calls : 0;
    pthread_mutex_unlock(&table_lock);
    return calls;
}

/* Test control: write "name count" lines of every function called so far. */
STANDIN_EXPORT void standin_dump_calls(const char *path)
{
    FILE *out = fopen(path, "w");
    if (out == NULL)
        return;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < TABLE_SIZE; ++i)
        if (table[i].name != NULL)
            fprintf(out, "%s %llu\n", table[i].name, (unsigned long long)table[i].calls);
    pthread_mutex_unlock(&table_lock);
    fclose(out);
}

static void dump_at_exit(void)
{
    const char *path = getenv("NPU_STANDIN_CALLS_FILE");
    if (path != NULL && *path != '\0')
        standin_dump_calls(path);
}

__attribute__((constructor)) static void register_dump(void)
{
    atexit(dump_at_exit);
}
