// Every file a program reads, opened and checked in one place; the one way JSON text is parsed.
#define _GNU_SOURCE // program_invocation_short_name
#include "files.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "utils.h"

// why the last open_regular_file (or read_whole_file, xfopen) failed, worded to follow the path
static char file_problem[160];

const char *file_error(void) {
    return file_problem;
}

static int refuse(int err, const char *why) {
    snprintf(file_problem, sizeof file_problem, "%s", why);
    errno = err;
    return -1;
}

// fstat: 0, or -1 with fd closed, errno and file_problem set
static int fstat_or_close(int fd, struct stat *st) {
    if (fstat(fd, st) == 0) return 0;
    int err = errno;
    close(fd);
    snprintf(file_problem, sizeof file_problem, "cannot be read: %s", strerror(err));
    errno = err;
    return -1;
}

// O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer, so
// fstat can refuse it; a regular file ignores the flag, which is cleared before any read
int open_regular_file(const char *path, int flags) {
    int fd = open(path, flags | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int err = errno;
        if (err == EISDIR) return refuse(err, "is a directory, not a file (name a file)");
        snprintf(file_problem, sizeof file_problem, "cannot be opened: %s", strerror(err));
        errno = err;
        return -1;
    }
    struct stat st;
    if (fstat_or_close(fd, &st) != 0) return -1;
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return refuse(S_ISDIR(st.st_mode) ? EISDIR : EINVAL,
                      S_ISDIR(st.st_mode)    ? "is a directory, not a file (name a file)"
                      : S_ISFIFO(st.st_mode) ? "is a FIFO (named pipe), not a regular file "
                                               "(name a file)"
                      : S_ISSOCK(st.st_mode) ? "is a socket, not a regular file (name a file)"
                                             : "is a device, not a regular file (name a file)");
    }
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
        close(fd);
        return refuse(errno, "cannot be read: fcntl failed");
    }
    return fd;
}

// the path an open stream writes to, for messages ("?" when /proc cannot say)
static const char *stream_path(FILE *f, char *buf, size_t size) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fileno(f));
    ssize_t n = readlink(link, buf, size - 1);
    if (n < 0) return "?";
    buf[n] = '\0';
    return buf;
}

FILE *xfopen_at(const char *path, const char *mode, const char *file, int line) {
    (void)file, (void)line;
    if (mode[0] == 'r') { // reading: regular files only, through the one check
        int fd = open_regular_file(path, strchr(mode, '+') ? O_RDWR : O_RDONLY);
        if (fd < 0) user_error("%s: %s %s", program_invocation_short_name, path, file_error());
        FILE *f = fdopen(fd, mode);
        if (!f)
            user_error("%s: %s cannot be opened: %s", program_invocation_short_name, path,
                       strerror(errno));
        return f;
    }
    FILE *f = fopen(path, mode);
    if (!f)
        user_error("%s: %s cannot be opened for writing: %s", program_invocation_short_name, path,
                   strerror(errno));
    return f;
}

void xfread_at(void *ptr, size_t size, size_t count, FILE *f, const char *file, int line) {
    if (fread(ptr, size, count, f) == count) return;
    char buf[4096];
    fail_at(file, line, "the file is truncated or not in the expected format",
            "short read from %s (%zu items of %zu bytes): %s", stream_path(f, buf, sizeof buf),
            count, size, ferror(f) ? strerror(errno) : "the file ended early");
}

void xfwrite_at(const void *ptr, size_t size, size_t count, FILE *f, const char *file, int line) {
    if (fwrite(ptr, size, count, f) == count) return;
    char buf[4096];
    fail_at(file, line, "is the disk full?", "short write to %s (%zu items of %zu bytes): %s",
            stream_path(f, buf, sizeof buf), count, size, strerror(errno));
}
// the bytes of fd up to its end (expect: its size, when known; a stream's grows the buffer);
// closes fd; NULL with errno and file_problem set when a read fails
static char *read_fd(int fd, size_t expect, int stream, size_t *size) {
    size_t cap = stream ? 65536 : expect, got = 0;
    char *bytes = xmalloc(cap + 1); // zeroed: text ends in '\0'
    while (stream || got < expect) {
        if (got == cap) { // a stream longer than the buffer: double it
            char *grown = xmalloc(2 * cap + 1);
            memcpy(grown, bytes, got);
            free(bytes);
            bytes = grown, cap *= 2;
        }
        ssize_t r = read(fd, bytes + got, cap - got);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0 && stream) break;
        if (r <= 0) {
            int err = r < 0 ? errno : EIO;
            close(fd);
            free(bytes);
            snprintf(file_problem, sizeof file_problem, "cannot be read: %s",
                     r < 0 ? strerror(err) : "it ended early (did it change while it was read?)");
            errno = err;
            return NULL;
        }
        got += (size_t)r;
    }
    close(fd);
    if (size) *size = got;
    return bytes;
}

char *read_whole_file(const char *path, size_t *size) {
    int fd = open_regular_file(path, O_RDONLY);
    if (fd < 0) return NULL;
    struct stat st;
    if (fstat_or_close(fd, &st) != 0) return NULL;
    return read_fd(fd, (size_t)st.st_size, 0, size);
}

char *read_whole_stream(const char *path, size_t *size) {
    if (strcmp(path, "-") == 0) return read_fd(dup(STDIN_FILENO), 0, 1, size);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISFIFO(st.st_mode))
        return read_whole_file(path, size);   // a regular file, or the line saying what it is
    int fd = open(path, O_RDONLY | O_NOCTTY); // a pipe waits for its writer here
    if (fd < 0) {
        snprintf(file_problem, sizeof file_problem, "cannot be opened: %s", strerror(errno));
        return NULL;
    }
    return read_fd(fd, 0, 1, size);
}

int write_whole_file(const char *path, const void *bytes, size_t size) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int ok = fwrite(bytes, 1, size, f) == size && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = errno;
    if (fclose(f) != 0 && ok) return -1;
    errno = err;
    return ok ? 0 : -1;
}

int make_dirs(const char *path) {
    char *dir = xmalloc(strlen(path) + 1);
    strcpy(dir, path);
    for (char *p = dir + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char end = *p;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            int err = errno;
            free(dir);
            errno = err;
            return -1;
        }
        *p = end;
        if (end == '\0') break;
    }
    free(dir);
    return 0;
}

// The marker a "\u0000" becomes before parsing: U+FFFF, the same six characters long, which no
// text needs (Unicode's noncharacter), so the tree shows which string held the NUL
#define NUL_MARK "\xEF\xBF\xBF"

// the dotted key of the first string (or key) holding the marker, into path; 1 when found
static int find_marked(const cJSON *item, char *path, size_t size) {
    int index = 0;
    for (const cJSON *c = item->child; c; c = c->next, index++) {
        size_t len = strlen(path);
        if (cJSON_IsArray(item))
            snprintf(path + len, size - len, "[%d]", index);
        else
            snprintf(path + len, size - len, "%s%s", len ? "." : "", c->string);
        if ((c->string && strstr(c->string, NUL_MARK)) ||
            (cJSON_IsString(c) && strstr(c->valuestring, NUL_MARK)) || find_marked(c, path, size))
            return 1;
        path[len] = '\0';
    }
    return 0;
}

cJSON *json_parse(const char *text, size_t size, const char **error_at, const char *where) {
    if (strlen(text) < size)
        user_error("%s: byte %zu is a NUL byte, which JSON text cannot hold (is it a binary "
                   "file?)",
                   where, strlen(text));
    // every backslash in valid JSON starts an escape inside a string: two characters at least
    const char *nul = NULL;
    for (const char *p = text; *p && !nul; p++)
        if (*p == '\\' && p[1] == 'u' && strncmp(p + 2, "0000", 4) == 0)
            nul = p;
        else if (*p == '\\' && p[1])
            p++;
    // size + 1: the '\0' after the text, which tells cJSON that nothing follows the value
    if (!nul) return cJSON_ParseWithLengthOpts(text, size + 1, error_at, 1);
    char *marked = xmalloc(size + 1);
    memcpy(marked, text, size);
    memcpy(marked + (nul - text), "\\uFFFF", 6);
    cJSON *root = cJSON_ParseWithLengthOpts(marked, size + 1, NULL, 1);
    char key[4096] = "";
    // one marker, 3 bytes that become 6 below: room kept for them
    if (root && !find_marked(root, key, sizeof key - 8)) key[0] = '\0';
    cJSON_Delete(root);
    free(marked);
    for (char *m; (m = strstr(key, NUL_MARK));) // the key as the file writes it
        memmove(m + 6, m + 3, strlen(m + 3) + 1), memcpy(m, "\\u0000", 6);
    long line = 1;
    for (const char *p = text; p < nul; p++) line += *p == '\n';
    char at[32] = ""; // a text of one line (a JSON Lines document): where names the line
    if (memchr(text, '\n', size ? size - 1 : 0)) snprintf(at, sizeof at, " (line %ld)", line);
    user_error("%s: %s%s holds \"\\u0000\"%s, a NUL character that would cut the string short; "
               "remove it",
               where, key[0] ? "key " : "a string", key, at);
}
