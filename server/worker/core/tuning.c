/* The worker's tuning knobs (tuning.h): their rows, defaults and bounds. */
#include "tuning.h"

#include <stdlib.h>
#include <string.h>

void tuning_rows(struct tuning *t, struct opt rows[TUNING_ROWS])
{
    const struct opt r[TUNING_ROWS] = {
        {"coll-chunk", "TPUEMU_COLL_CHUNK", OPT_BYTES, "512K", 1, 64LL << 20, "BYTES",
         "collectives: bytes of one chunk (a request's own chunk size wins)", &t->coll_chunk},
        {"coll-depth", "TPUEMU_COLL_DEPTH", OPT_INT, "8", 1, 64, "N",
         "collectives: chunks in flight per peer (receive slots)", &t->coll_depth},
        {"coll-hd-max", "TPUEMU_COLL_HD_MAX", OPT_BYTES, NULL, 0, 1LL << 40, "BYTES",
         "collectives: halving-doubling below this size, ring from it (default 512K, and 2M for an "
         "all-reduce on a power-of-two count of cores)",
         &t->coll_hd_max},
        {"coll-rd-max", "TPUEMU_COLL_RD_MAX", OPT_BYTES, "32K", 0, 1LL << 40, "BYTES",
         "collectives: recursive doubling below this size", &t->coll_rd_max},
        {"coll-hier-min", "TPUEMU_COLL_HIER_MIN", OPT_BYTES, "1M", 0, 1LL << 50, "BYTES",
         "collectives: hierarchical all-reduce (4 or more cores) from this size", &t->coll_hier_min},
        {"coll-shm-direct", "TPUEMU_COLL_SHM_DIRECT", OPT_INT, "1", 0, 1, "0|1",
         "collectives: 0 makes no host segment, so this host's cores do not use the direct path", &t->coll_shm_direct},
        {"coll-shm-max", "TPUEMU_COLL_SHM_MAX", OPT_BYTES, "1M", 0, 256LL << 20, "BYTES",
         "collectives: bytes of each area of the host segment; larger all-reduces take the rings "
         "(under 64: no segment)",
         &t->coll_shm_max},
        {"coll-shm-one-max", "TPUEMU_COLL_SHM_ONE_MAX", OPT_BYTES, "64K", 0, 1LL << 40, "BYTES",
         "collectives: the direct path's one-barrier variant below this size", &t->coll_shm_one_max},
        {"spin-us", "TPUEMU_SPIN_US", OPT_INT, "200", 0, 1000000, "US",
         "how long a waiting receive polls after the last progress before it sleeps (0: never polls)", &t->spin_us},
        {"dp-sockbuf", "TPUEMU_DP_SOCKBUF", OPT_BYTES, "0", 0, 1LL << 30, "BYTES",
         "send and receive buffers of data-plane sockets (0: the kernel's autotuning)", &t->dp_sockbuf},
        {"heap-prefault-kb", "TPUEMU_HEAP_PREFAULT_KB", OPT_INT, "256", 0, 2048, "KIB",
         "heap touched at start, for the first initialize (0: none)", &t->heap_prefault_kb},
        {"train-inline-max-us", "TPUEMU_TRAIN_INLINE_MAX_US", OPT_INT, "1000", 0, 1000000000, "US",
         "training steps whose last compute took less run on the loop thread (0: always the pool)",
         &t->train_inline_max_us},
        {"test-step-ms", "TPUEMU_TEST_STEP_MS", OPT_INT, "0", 0, 60000, "MS",
         "tests only: each training step's compute takes at least this long (0: off)", &t->test_step_ms},
        {"test-lose-chunk", "TPUEMU_TEST_LOSE_CHUNK", OPT_STRING, "", 0, 0, "HOST/CORE:N",
         "tests only: the Nth data-plane chunk to come from core HOST/CORE over TCP is lost on the way (read "
         "and thrown away, once; empty: off)",
         &t->test_lose_chunk},
        {"mxu-bf16", "TPUEMU_MXU_BF16", OPT_STRING, "auto", 0, 0, "auto|onednn|f32",
         "the matrix unit's bfloat16 products: oneDNN's bf16 matmul where the CPU has it (auto), "
         "always (onednn), or inputs widened to float32 (f32)",
         &t->mxu_bf16},
    };
    t->coll_hd_max = -1;
    memcpy(rows, r, sizeof r);
}

int tuning_lose_chunk(const char *spec, char *peer, size_t peer_len, unsigned long *nth)
{
    const char *colon = spec ? strrchr(spec, ':') : NULL, *slash = spec ? strchr(spec, '/') : NULL;
    char *end;
    unsigned long n;

    if (!spec || !*spec)
        return 0;
    if (!colon || !slash || slash > colon || slash == spec || (size_t)(colon - spec) >= peer_len)
        return -1;
    n = strtoul(colon + 1, &end, 10);
    if (*end || end == colon + 1 || n == 0)
        return -1;
    memcpy(peer, spec, (size_t)(colon - spec));
    peer[colon - spec] = '\0';
    *nth = n;
    return 1;
}

int tuning_check(const struct tuning *t, err *e)
{
    char peer[300];
    unsigned long n;

    if (tuning_lose_chunk(t->test_lose_chunk, peer, sizeof peer, &n) < 0)
        return err_set(e, CODE_INVALID_ARGUMENT, "--test-lose-chunk: '%s' is not HOST/CORE:N (N from 1)",
                       t->test_lose_chunk);
    if (strcmp(t->mxu_bf16, "auto") != 0 && strcmp(t->mxu_bf16, "onednn") != 0 && strcmp(t->mxu_bf16, "f32") != 0)
        return err_set(e, CODE_INVALID_ARGUMENT, "--mxu-bf16: '%s' is not one of auto, onednn, f32", t->mxu_bf16);
    return CODE_OK;
}

static struct tuning set_once;
static int is_set;

void tuning_set(const struct tuning *t)
{
    set_once = *t;
    is_set = 1;
}

const struct tuning *tuning_get(void)
{
    static _Thread_local struct tuning env;
    struct opt rows[TUNING_ROWS];
    char prog[] = "tpu-worker", *argv[] = {prog, NULL};
    int first;
    err e;

    if (is_set)
        return &set_once;
    /* each row alone, so that a bad value leaves only its own default */
    tuning_rows(&env, rows);
    for (size_t k = 0; k < TUNING_ROWS; k++)
        if (opt_parse(&rows[k], 1, 1, argv, &first, &e) != CODE_OK) {
            struct opt def = rows[k];
            def.env = NULL;
            (void)opt_parse(&def, 1, 1, argv, &first, &e);
        }
    if (tuning_check(&env, &e) != CODE_OK) {
        char peer[300];
        unsigned long n;
        if (tuning_lose_chunk(env.test_lose_chunk, peer, sizeof peer, &n) < 0)
            env.test_lose_chunk = "";
        if (tuning_check(&env, &e) != CODE_OK)
            env.mxu_bf16 = "auto";
    }
    return &env;
}
