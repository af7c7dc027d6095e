// SVG output: one element per call, written as it comes (no tree in memory).
#include "svg.h"
#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include "utils.h"

// text as XML character data or an attribute value: the five characters XML reserves
static void write_escaped(FILE *f, const char *text) {
    for (const char *c = text; *c; c++) {
        switch (*c) {
        case '&':
            fputs("&amp;", f);
            break;
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        case '\'':
            fputs("&apos;", f);
            break;
        default:
            fputc(*c, f);
        }
    }
}

// an element's tooltip and its end: <title> must be a child, so a titled element has a body
static void end_element(Svg *svg, const char *tag, const char *title) {
    if (!title) {
        fputs("/>\n", svg->f);
        return;
    }
    fputs("><title>", svg->f);
    write_escaped(svg->f, title);
    fprintf(svg->f, "</title></%s>\n", tag);
}

void svg_open(Svg *svg, const char *path, double width, double height) {
    *svg = (Svg){.f = fopen(path, "w"), .path = path, .width = width, .height = height};
    if (!svg->f)
        user_error("cannot write %s: %s (does its folder exist, and may you write there?)", path,
                   strerror(errno));
    fprintf(svg->f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.2f\" height=\"%.2f\" "
            "viewBox=\"0 0 %.2f %.2f\" font-family=\"sans-serif\">\n",
            width, height, width, height);
    svg_rect(svg, 0, 0, width, height, "white", NULL);
}

void svg_close(Svg *svg) {
    fputs("</svg>\n", svg->f);
    // fprintf's errors stick to the stream: one check here covers every element written
    int err = ferror(svg->f) ? EIO : 0;
    if (fclose(svg->f) != 0) err = errno;
    if (err) user_error("cannot write %s: %s (is the disk full?)", svg->path, strerror(err));
    svg->f = NULL;
}

void svg_rect(Svg *svg, double x, double y, double w, double h, const char *fill,
              const char *title) {
    fprintf(svg->f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"", x, y,
            w, h, fill);
    end_element(svg, "rect", title);
}

void svg_line(Svg *svg, double x1, double y1, double x2, double y2, const char *stroke,
              double width) {
    fprintf(svg->f,
            "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" "
            "stroke-width=\"%.2f\"/>\n",
            x1, y1, x2, y2, stroke, width);
}

void svg_text(Svg *svg, double x, double y, double size, const char *anchor, const char *fill,
              const char *fmt, ...) {
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    fprintf(svg->f,
            "<text x=\"%.2f\" y=\"%.2f\" font-size=\"%.2f\" text-anchor=\"%s\" fill=\"%s\">", x, y,
            size, anchor, fill);
    write_escaped(svg->f, text);
    fputs("</text>\n", svg->f);
}

void svg_path_named(Svg *svg, const double *x, const double *y, int n, const char *stroke,
                    double width, const char *cls, const char *title, const char *name) {
    fputs("<path", svg->f);
    if (cls) fprintf(svg->f, " class=\"%s\"", cls);
    if (name) {
        fputs(" data-name=\"", svg->f);
        write_escaped(svg->f, name);
        fputc('"', svg->f);
    }
    fprintf(svg->f, " data-points=\"%d\" fill=\"none\" stroke=\"%s\" stroke-width=\"%.2f\" ", n,
            stroke, width);
    // round joins: a curve with a kink every step stays smooth at any zoom
    fputs("stroke-linejoin=\"round\" stroke-linecap=\"round\" d=\"", svg->f);
    for (int i = 0; i < n; i++) fprintf(svg->f, "%s%.2f %.2f", i ? " L" : "M", x[i], y[i]);
    fputc('"', svg->f);
    end_element(svg, "path", title);
}

void svg_path(Svg *svg, const double *x, const double *y, int n, const char *stroke, double width,
              const char *cls, const char *title) {
    svg_path_named(svg, x, y, n, stroke, width, cls, title, NULL);
}
