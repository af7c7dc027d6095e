// Every file a program reads is opened by open_regular_file (read_whole_file and xfopen's reading
// modes call it), and every JSON text is parsed by json_parse, so each check lives in one place.
#pragma once
#include <stdio.h>
#include <stddef.h>

// Opens path (flags O_RDONLY or O_RDWR) when it is a
// regular file; a directory, FIFO or device is refused at once (a FIFO never blocks the open):
// -1, errno set, and file_error() says why in words that follow the path, as in
// user_error("config error: %s %s", path, file_error()) ->
// "config error: model.json is a directory, not a file (name a file)"
int open_regular_file(const char *path, int flags);
const char *file_error(void);

// fopen/fread/fwrite that never return failure: xfopen's reading modes go through
// open_regular_file; a short read or write names the file and errno
FILE *xfopen_at(const char *path, const char *mode, const char *file, int line);
#define xfopen(path, mode) xfopen_at((path), (mode), __FILE__, __LINE__)
void xfread_at(void *ptr, size_t size, size_t count, FILE *f, const char *file, int line);
#define xfread(ptr, size, count, f) xfread_at((ptr), (size), (count), (f), __FILE__, __LINE__)
void xfwrite_at(const void *ptr, size_t size, size_t count, FILE *f, const char *file, int line);
#define xfwrite(ptr, size, count, f) xfwrite_at((ptr), (size), (count), (f), __FILE__, __LINE__)

// The whole file, '\0'-terminated, its length in *size; NULL with errno and file_error() set when
// it cannot be read (or is no regular file), so each caller words the one-line error its user needs
char *read_whole_file(const char *path, size_t *size);
// read_whole_file's twin for a stream: path "-" (standard input, whatever it is) or a FIFO (a
// pipe: mkfifo's, bash's <(...), /dev/stdin on a pipe) is read to its end; anything else goes to
// read_whole_file, which reads a regular file and refuses a directory or a device as ever
char *read_whole_stream(const char *path, size_t *size);
// Writes size bytes to path, flushed and fsync'd (a checkpoint's files are on disk when it is
// committed): 0, or -1 with errno set
int write_whole_file(const char *path, const void *bytes, size_t size);
// The one way JSON text is parsed: `size` bytes read from a file (text[size] is '\0'). NULL when it
// is not one JSON value (*error_at, if not NULL: where the parser stopped). A NUL inside a
// string ("\u0000") or in the text would cut a C string short: one line "<where>: key a.b holds
// ..." and exit. where: the message's start, naming the file ("config error: run.json").
struct cJSON;
struct cJSON *json_parse(const char *text, size_t size, const char **error_at, const char *where);
// mkdir -p: 0, or -1 with errno set
int make_dirs(const char *path);
