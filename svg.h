// The one place that writes SVG: plot_loss's loss curves and the trace's timeline. Coordinates
// are user units with y growing downward (SVG's convention); every text is XML-escaped here, so
// callers pass run names and file names as they are.
#pragma once
#include <stdio.h>

typedef struct {
    FILE *f;
    const char *path;
    double width, height;
} Svg;

// header and a white background; a path that cannot be written ends the program, naming it
void svg_open(Svg *svg, const char *path, double width, double height);
// writes </svg>; a failed write or close (a full disk) ends the program naming the path
void svg_close(Svg *svg);

// title: a hover tooltip (<title>), or NULL
void svg_rect(Svg *svg, double x, double y, double w, double h, const char *fill,
              const char *title);
void svg_line(Svg *svg, double x1, double y1, double x2, double y2, const char *stroke,
              double width);
// anchor: "start", "middle" or "end" (where x is on the text)
void svg_text(Svg *svg, double x, double y, double size, const char *anchor, const char *fill,
              const char *fmt, ...) __attribute__((format(printf, 7, 8)));
// one polyline <path d="M..L.."> through (x[i], y[i]), i < n; cls: its class (NULL: none);
// data-points="n" lets a reader count the vertices without parsing d
void svg_path(Svg *svg, const double *x, const double *y, int n, const char *stroke, double width,
              const char *cls, const char *title);
// svg_path that also writes data-name="name", so a test finds one curve among many by its name
void svg_path_named(Svg *svg, const double *x, const double *y, int n, const char *stroke,
                    double width, const char *cls, const char *title, const char *name);
