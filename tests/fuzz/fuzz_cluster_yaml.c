/* fuzz_cluster_yaml.c — libFuzzer target for cluster/cluster_config (cluster.yaml).
 *
 * Beyond "no crash, no leak, no undefined behaviour" it checks: a failure leaves *out zeroed and
 * a message "fuzz.yaml:LINE:COLUMN: ..." with LINE, COLUMN >= 1 (or out of memory); an accepted
 * file satisfies the documented invariants (>= 1 node, valid unique names, absolute workdir,
 * host exactly for ssh, max_adapters >= 1, positive sizes, unique GPU UUIDs, env "NAME=VALUE").
 * tests/unit/test_fuzz_corpus_cluster_yaml.c runs tests/fuzz/corpus/cluster_yaml/ through it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/cluster_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_cluster_yaml: check failed at %s:%d: %s\n", __FILE__, __LINE__, \
                    #cond);                                                                        \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tdm_cluster_config cfg;
    tdm_error err = {0};
    tdm_status st = tdm_cluster_config_parse((const char *)data, size, "fuzz.yaml", &cfg, &err);
    if (st != TDM_OK) {
        CHECK(cfg.nodes == NULL && cfg.n_nodes == 0 && cfg.file == NULL && cfg.ssh_config == NULL);
        CHECK(cfg.slurm.shared.workdir == NULL && cfg.slurm.extra == NULL);
        if (st == TDM_ERR_NOMEM)
            return 0;
        CHECK(st == TDM_ERR_PARSE || st == TDM_ERR_INVALID);
        unsigned long line = 0, col = 0;
        CHECK(sscanf(err.message, "fuzz.yaml:%lu:%lu: ", &line, &col) == 2);
        CHECK(line >= 1 && col >= 1);
        return 0;
    }
    CHECK(!strcmp(cfg.file, "fuzz.yaml"));
    if (cfg.scheduler == TDM_SCHEDULER_SLURM) {
        /* Slurm picks the nodes: none listed; the shared workdir is a local node */
        const tdm_slurm_config *sl = &cfg.slurm;
        CHECK(cfg.n_nodes == 0 && cfg.nodes == NULL);
        CHECK(sl->shared.workdir && sl->shared.workdir[0] == '/' && !strchr(sl->shared.workdir, '\n'));
        CHECK(sl->shared.transport == TDM_TRANSPORT_LOCAL && !strcmp(sl->shared.name, "slurm"));
        CHECK(sl->gpus_per_job == 0 || (sl->gpus_per_job >= 1 && sl->gpu_vram_mb > 0));
        CHECK(sl->signal_grace_s >= 1 && sl->max_adapters >= 1);
        for (size_t e = 0; e < sl->n_extra; e++)
            CHECK(!strncmp(sl->extra[e], "--", 2) && !strpbrk(sl->extra[e], "\n\r"));
        tdm_cluster_config_free(&cfg);
        return 0;
    }
    CHECK(cfg.n_nodes >= 1);
    for (size_t i = 0; i < cfg.n_nodes; i++) {
        const tdm_cluster_node *n = &cfg.nodes[i];
        size_t nl = strlen(n->name);
        CHECK(nl >= 1 && nl <= TDM_CLUSTER_NAME_MAX && strspn(n->name, "abcdefghijklmnopqrstuvwxyz"
                                                                       "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                                       "0123456789._-") == nl);
        CHECK(n->workdir && n->workdir[0] == '/' && !strchr(n->workdir, '\n'));
        CHECK(n->tandem && n->tandem[0]);
        CHECK((n->transport == TDM_TRANSPORT_SSH) == (n->host != NULL));
        CHECK(!n->host || (n->host[0] && n->host[0] != '-'));
        CHECK(n->max_adapters >= 1 && n->cpu_max_params >= 0);
        CHECK(n->port >= 0 && n->port <= 65535 && n->cpu_cores >= 0 && n->ram_mb >= 0);
        CHECK(n->line >= 1 && n->col >= 1);
        CHECK(tdm_cluster_config_find(&cfg, n->name) == n);
        for (size_t e = 0; e < n->n_env; e++)
            CHECK(strchr(n->env[e], '=') && n->env[e][0] != '=');
        for (size_t g = 0; g < n->n_gpus; g++) {
            CHECK(n->gpus[g].uuid && n->gpus[g].uuid[0]);
            CHECK(n->gpus[g].vram_mb >= 0 && n->gpus[g].speed >= 0);
            for (size_t j = 0; j < cfg.n_nodes; j++)
                for (size_t h = 0; h < cfg.nodes[j].n_gpus; h++)
                    CHECK((j == i && h == g) || strcmp(cfg.nodes[j].gpus[h].uuid, n->gpus[g].uuid));
        }
    }
    tdm_cluster_config_free(&cfg);
    return 0;
}
