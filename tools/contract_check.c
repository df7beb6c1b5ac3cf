/* contract_check — validates the contract files in contracts/ (see docs/contracts.md) and, given ctest's JUnit
 * output, that every cited test passed in that run.
 *
 *   contract_check [--root DIR] [--junit FILE] CONTRACT.yaml...
 *
 * Fails (exit 1, one line per problem, FILE:LINE:COLUMN) when a contract is malformed (missing or
 * mistyped keys, duplicate ids, an obligation without a falsification test, a kind other than
 * invariant/bound/ordering, a reference to an unknown test id), names an affected file that does
 * not exist, cites a test that does not exist ("unit.NAME[:case]" needs tests/unit/test_NAME.c and,
 * with a case, that cmocka case registered in it; "integration.NAME" needs
 * tests/integration/NAME.sh), or, with --junit, cites a test that did not run and pass (a case must
 * appear as "[       OK ] case" in that test's output).
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

static int problems;
static const char *cur_file;

static void problem(const yaml_node_t *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (n)
        fprintf(stderr, "%s:%zu:%zu: ", cur_file, n->start_mark.line + 1, n->start_mark.column + 1);
    else
        fprintf(stderr, "%s: ", cur_file);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    problems++;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf)
        buf[n] = '\0';
    fclose(f);
    return buf;
}

static yaml_node_t *get(yaml_document_t *d, yaml_node_t *map, const char *key)
{
    if (!map || map->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(d, p->key);
        if (k->type == YAML_SCALAR_NODE && !strcmp((char *)k->data.scalar.value, key))
            return yaml_document_get_node(d, p->value);
    }
    return NULL;
}

static const char *scalar(yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE && n->data.scalar.length > 0
               ? (const char *)n->data.scalar.value
               : NULL;
}

static const char *need_scalar(yaml_document_t *d, yaml_node_t *map, const char *key)
{
    yaml_node_t *v = get(d, map, key);
    const char *s = scalar(v);
    if (!s)
        problem(v ? v : map, "\"%s\" must be a non-empty string", key);
    return s;
}

static yaml_node_t *need_seq(yaml_document_t *d, yaml_node_t *map, const char *key)
{
    yaml_node_t *v = get(d, map, key);
    if (!v || v->type != YAML_SEQUENCE_NODE ||
        v->data.sequence.items.top == v->data.sequence.items.start) {
        problem(v ? v : map, "\"%s\" must be a non-empty list", key);
        return NULL;
    }
    return v;
}

#define FOR_ITEMS(d, seq, node, it)                                                                \
    for (yaml_node_item_t *it = (seq)->data.sequence.items.start;                                  \
         it < (seq)->data.sequence.items.top && ((node) = yaml_document_get_node((d), *it)); it++)

static const char *root_dir = ".";
static char *junit;

/* The output block of one testcase in the JUnit file, or NULL. Sets *passed. */
static const char *junit_case(const char *name, bool *passed, const char **end)
{
    char needle[512];
    snprintf(needle, sizeof needle, "<testcase name=\"%s\"", name);
    const char *at = strstr(junit, needle);
    *passed = false;
    if (!at)
        return NULL;
    const char *close = strstr(at, "</testcase>");
    *end = close ? close : at + strlen(at);
    const char *tag_end = strchr(at, '>');
    bool run = tag_end && strstr(at, "status=\"run\"") && strstr(at, "status=\"run\"") < tag_end;
    const char *fail = strstr(at, "<failure");
    *passed = run && !(fail && fail < *end);
    return at;
}

static void check_test_ref(yaml_node_t *n, const char *ref)
{
    char name[256], kase[256] = "";
    const char *colon = strchr(ref, ':');
    size_t len = colon ? (size_t)(colon - ref) : strlen(ref);
    if (len >= sizeof name || (colon && strlen(colon + 1) >= sizeof kase)) {
        problem(n, "test reference too long: %s", ref);
        return;
    }
    memcpy(name, ref, len);
    name[len] = '\0';
    if (colon)
        strcpy(kase, colon + 1);
    char path[1024];
    if (!strncmp(name, "unit.", 5))
        snprintf(path, sizeof path, "%s/tests/unit/test_%s.c", root_dir, name + 5);
    else if (!strncmp(name, "integration.", 12))
        snprintf(path, sizeof path, "%s/tests/integration/%s.sh", root_dir, name + 12);
    else {
        problem(n, "test \"%s\" is neither unit.NAME nor integration.NAME", ref);
        return;
    }
    char *src = slurp(path);
    if (!src) {
        problem(n, "test \"%s\" does not exist (no %s)", ref, path);
        return;
    }
    if (kase[0]) {
        char reg[300], reg2[300];
        snprintf(reg, sizeof reg, "cmocka_unit_test(%s)", kase);
        snprintf(reg2, sizeof reg2, "cmocka_unit_test_setup_teardown(%s,", kase);
        if (!strstr(src, reg) && !strstr(src, reg2))
            problem(n, "test case \"%s\" is not registered in %s", kase, path);
    }
    free(src);
    if (junit) {
        bool passed;
        const char *end;
        const char *at = junit_case(name, &passed, &end);
        if (!at)
            problem(n, "test \"%s\" did not run in this ctest run", name);
        else if (!passed)
            problem(n, "test \"%s\" did not pass", name);
        else if (kase[0]) {
            char ok[300];
            snprintf(ok, sizeof ok, "[       OK ] %s\n", kase);
            const char *hit = strstr(at, ok);
            if (!hit || hit > end)
                problem(n, "test case \"%s\" of %s did not pass", kase, name);
        }
    }
}

static void check_contract(const char *path)
{
    cur_file = path;
    FILE *f = fopen(path, "rb");
    if (!f) {
        problem(NULL, "cannot open");
        return;
    }
    yaml_parser_t parser;
    yaml_document_t doc;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc)) {
        fprintf(stderr, "%s:%zu:%zu: YAML error: %s\n", path, parser.problem_mark.line + 1,
                parser.problem_mark.column + 1, parser.problem ? parser.problem : "?");
        problems++;
        yaml_parser_delete(&parser);
        fclose(f);
        return;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root || root->type != YAML_MAPPING_NODE) {
        problem(root, "the top level must be a mapping");
        goto done;
    }
    need_scalar(&doc, root, "contract");
    need_scalar(&doc, root, "summary");
    yaml_node_t *eqs = need_seq(&doc, root, "equations");
    yaml_node_t *obs = need_seq(&doc, root, "proof_obligations");
    yaml_node_t *fts = need_seq(&doc, root, "falsification_tests");
    yaml_node_t *files = need_seq(&doc, root, "affected_files");
    yaml_node_t *gate = get(&doc, root, "qa_gate");
    if (!gate || gate->type != YAML_MAPPING_NODE)
        problem(gate ? gate : root, "\"qa_gate\" must be a mapping");
    else
        need_scalar(&doc, gate, "command");
    yaml_node_t *n;
    if (eqs)
        FOR_ITEMS(&doc, eqs, n, it1)
        {
            need_scalar(&doc, n, "id");
            need_scalar(&doc, n, "formula");
        }
    /* Falsification tests: ids unique, fields present, test references real. */
    const char *ft_ids[256];
    bool ft_used[256] = {false};
    int n_ft = 0;
    if (fts)
        FOR_ITEMS(&doc, fts, n, it2)
        {
            const char *id = need_scalar(&doc, n, "id");
            need_scalar(&doc, n, "prediction");
            need_scalar(&doc, n, "failure_means");
            const char *test = need_scalar(&doc, n, "test");
            if (test)
                check_test_ref(get(&doc, n, "test"), test);
            if (id) {
                for (int i = 0; i < n_ft; i++)
                    if (!strcmp(ft_ids[i], id))
                        problem(n, "duplicate falsification test id %s", id);
                if (n_ft < 256)
                    ft_ids[n_ft++] = id;
            }
        }
    if (obs)
        FOR_ITEMS(&doc, obs, n, it3)
        {
            need_scalar(&doc, n, "id");
            need_scalar(&doc, n, "statement");
            const char *kind = need_scalar(&doc, n, "kind");
            if (kind && strcmp(kind, "invariant") && strcmp(kind, "bound") &&
                strcmp(kind, "ordering"))
                problem(get(&doc, n, "kind"), "kind must be invariant, bound or ordering, not %s",
                        kind);
            yaml_node_t *refs = need_seq(&doc, n, "falsified_by");
            yaml_node_t *r;
            if (refs)
                FOR_ITEMS(&doc, refs, r, it4)
                {
                    const char *rid = scalar(r);
                    bool found = false;
                    for (int i = 0; rid && i < n_ft; i++)
                        if (!strcmp(ft_ids[i], rid))
                            found = ft_used[i] = true;
                    if (!found)
                        problem(r, "unknown falsification test %s", rid ? rid : "(not a string)");
                }
        }
    for (int i = 0; i < n_ft; i++)
        if (!ft_used[i])
            problem(fts, "falsification test %s is not cited by any obligation", ft_ids[i]);
    if (files)
        FOR_ITEMS(&doc, files, n, it5)
        {
            const char *rel = scalar(n);
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", root_dir, rel ? rel : "");
            if (!rel || access(p, F_OK) != 0)
                problem(n, "affected file %s does not exist", rel ? rel : "(not a string)");
        }
done:
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    fclose(f);
}

int main(int argc, char **argv)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--root") && i + 1 < argc)
            root_dir = argv[++i];
        else if (!strcmp(argv[i], "--junit") && i + 1 < argc) {
            junit = slurp(argv[++i]);
            if (!junit) {
                fprintf(stderr, "contract_check: cannot read %s\n", argv[i]);
                return 1;
            }
        } else {
            fprintf(stderr, "usage: contract_check [--root DIR] [--junit FILE] CONTRACT.yaml...\n");
            return 2;
        }
    }
    if (i == argc) {
        fprintf(stderr, "usage: contract_check [--root DIR] [--junit FILE] CONTRACT.yaml...\n");
        return 2;
    }
    for (; i < argc; i++)
        check_contract(argv[i]);
    free(junit);
    if (problems) {
        fprintf(stderr, "contract_check: %d problem(s)\n", problems);
        return 1;
    }
    printf("contract_check: ok\n");
    return 0;
}
