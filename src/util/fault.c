#include "util/fault.h"

#include <stdlib.h>
#include <string.h>

bool tdm_fault(const char *point)
{
    const char *list = getenv("TANDEM_FAULT_INJECT");
    if (!list || !*list)
        return false;
    size_t n = strlen(point);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && memcmp(p, point, n) == 0)
            return true;
        if (!end)
            break;
        p = end + 1;
    }
    return false;
}
