#include "data/data_model.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "data/render.h"
#include "tokenizer/chat_template.h"

tdm_status tdm_data_model_open(tdm_data_model *m, const char *path, int64_t config_vocab_size,
                               bool template_given, tdm_dataset_opts *o, tdm_error *err)
{
    memset(m, 0, sizeof *m);
    struct stat sb;
    bool is_dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    int len = is_dir
                  ? snprintf(m->tokenizer_path, sizeof m->tokenizer_path, "%s/tokenizer.json", path)
                  : snprintf(m->tokenizer_path, sizeof m->tokenizer_path, "%s", path);
    if (len < 0 || (size_t)len >= sizeof m->tokenizer_path)
        return tdm_fail(err, TDM_ERR_INVALID, "path too long: %s", path);
    /* Only "there is no such file" in a model directory that has a config makes the tokenizer
     * optional; any other failure (unreadable, malformed) is the loader's error. */
    bool optional =
        is_dir && config_vocab_size > 0 && stat(m->tokenizer_path, &sb) != 0 && errno == ENOENT;
    if (!optional) {
        tdm_status st = tdm_tokenizer_load(&m->tok, m->tokenizer_path, err);
        if (st != TDM_OK) return st;
        m->have_tokenizer = true;
    }
    tdm_tokenizer *tok = tdm_data_model_tokenizer(m);
    o->vocab_size = config_vocab_size > 0 ? config_vocab_size : tok->n_ids;
    o->tokenizer_path = m->tokenizer_path;
    if (!template_given) o->chat_template = tok ? tdm_chat_template_detect(tok) : TDM_CHAT_NONE;
    o->eos_id = tok ? tdm_data_find_eos(tok, is_dir ? path : NULL) : -1;
    return TDM_OK;
}

tdm_tokenizer *tdm_data_model_tokenizer(tdm_data_model *m)
{
    return m->have_tokenizer ? &m->tok : NULL;
}

void tdm_data_model_close(tdm_data_model *m)
{
    if (m->have_tokenizer) tdm_tokenizer_free(&m->tok);
    m->have_tokenizer = false;
}
