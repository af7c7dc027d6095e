// plot_loss: the loss curves of ./train's metrics files in one SVG picture. Does a run learn, and
// do two layouts train alike (the 8-rank curve lies on the 1-rank curve)?
//   ./plot_loss --out tmp/loss.svg tmp/one/metrics.jsonl tmp/eight/metrics.jsonl=dp2xtp2xpp2
// Each FILE is a logging.metrics_file (./create_config --metrics_file): one JSON line per step,
// {"step": 3, "loss": 5.12, "tokens": 768, "seconds": 0.01}. Each run is drawn thinner than the one
// before, over it, so curves that coincide all stay visible; hovering one in a browser names it.
#include <cjson/cJSON.h>
#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <string.h>
#include "svg.h"
#include "utils.h"

static const char *USAGE =
    "usage: ./plot_loss --out FILE.svg [--x step|tokens] [--title TEXT] [--log_y] FILE[=NAME]...\n"
    "  --out    the picture to write (SVG: open it in a browser)\n"
    "  --x      the horizontal axis: optimizer steps (default) or tokens seen\n"
    "  --title  the picture's title (default: training loss)\n"
    "  --log_y  a logarithmic loss axis\n"
    "  FILE     a metrics file of ./train (logging.metrics_file); NAME: its legend entry";

typedef struct {
    char path[1024], name[1024], folder[1024]; // folder: the one holding the file, or ""
    double *x, *loss;                          // one point per line of the file
    int n;
} Run;

// the drawn range [lo, hi] (log10 of it on a log axis) and the values that get a tick
typedef struct {
    double lo, hi;
    int log, num_ticks;
    double ticks[64];
} Axis;

// the picture, in SVG units: the plot area is inset by room for the title, labels and axis names
static const double WIDTH = 800, HEIGHT = 500, LEFT = 70, RIGHT = 20, TOP = 50, BOTTOM = 55;
static const char *COLORS[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                               "#9467bd", "#8c564b", "#e377c2", "#17becf"};

// FILE=NAME, split at the first '=' after the last '/' (a folder may hold one: tmp/lr=3e-4/...)
static void parse_run(Run *run, const char *arg) {
    if (strlen(arg) >= sizeof run->path)
        user_error("plot_loss: %s is longer than %zu characters", arg, sizeof run->path - 1);
    snprintf(run->path, sizeof run->path, "%s", arg);
    char *slash = strrchr(run->path, '/'), *eq = strchr(slash ? slash : run->path, '=');
    if (eq) *eq = '\0';
    snprintf(run->name, sizeof run->name, "%s", eq ? eq + 1 : "");
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", run->path);
    const char *folder = basename(dirname(copy)); // dirname may write into its argument
    snprintf(run->folder, sizeof run->folder, "%s",
             strcmp(folder, ".") && strcmp(folder, "/") && strcmp(folder, "..") ? folder : "");
}

// one point per non-blank line: x_key ("step" or "tokens") and "loss"
static void load_run(Run *run, const char *x_key, int log_y) {
    char *text = read_whole_file(run->path, NULL);
    if (!text)
        user_error("plot_loss: %s %s (name a metrics file of ./train: logging.metrics_file)",
                   run->path, file_error());
    int lines = 1;
    for (const char *c = text; *c; c++) lines += *c == '\n';
    run->x = xmalloc(lines * sizeof(double));
    run->loss = xmalloc(lines * sizeof(double));
    long number = 0;
    for (char *line = text, *next; *line; line = next) {
        number++;
        next = line + strcspn(line, "\n");
        if (*next) *next++ = '\0';
        if (line[strspn(line, " \t\r")] == '\0') continue;
        cJSON *doc = cJSON_Parse(line);
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(doc, x_key);
        const cJSON *loss = cJSON_GetObjectItemCaseSensitive(doc, "loss");
        // C's printf writes a diverged loss as nan, -nan, inf or -inf, which no JSON parser reads:
        // name it for what it is
        const char *at = strstr(line, "\"loss\": ");
        int nan_text = !doc && at && at[8] && strchr("-in", at[8]);
        if (nan_text || (cJSON_IsNumber(x) && cJSON_IsNumber(loss) &&
                         !(isfinite(x->valuedouble) && isfinite(loss->valuedouble))))
            user_error("plot_loss: %s line %ld holds a number that is not finite (the run "
                       "diverged at this step); plot only the lines before it",
                       run->path, number);
        if (!cJSON_IsNumber(x) || !cJSON_IsNumber(loss))
            user_error("plot_loss: %s line %ld is not a JSON object with numbers \"%s\" and "
                       "\"loss\" (a line of ./train's logging.metrics_file)",
                       run->path, number, x_key);
        if (log_y && loss->valuedouble <= 0)
            user_error("plot_loss: %s line %ld: loss %g has no logarithm; leave out --log_y",
                       run->path, number, loss->valuedouble);
        run->x[run->n] = x->valuedouble;
        run->loss[run->n++] = loss->valuedouble;
        cJSON_Delete(doc);
    }
    free(text);
    if (run->n == 0)
        user_error("plot_loss: %s holds no metrics lines: its run logged no step yet", run->path);
}

// legend entries of the runs not named with '=': their folder (an experiment's name) when no other
// run's file lies in a folder of that name, else the file name
static void name_runs(Run *runs, int num_runs) {
    for (int i = 0; i < num_runs; i++) {
        int shared = 0;
        for (int j = 0; j < num_runs; j++)
            shared |= j != i && !strcmp(runs[i].folder, runs[j].folder);
        const char *base = strrchr(runs[i].path, '/');
        if (!runs[i].name[0])
            snprintf(runs[i].name, sizeof runs[i].name, "%s",
                     runs[i].folder[0] && !shared ? runs[i].folder
                     : base                       ? base + 1
                                                  : runs[i].path);
    }
}

// the axis of every run's x values, or of their losses: about 5 ticks at whole multiples of 1, 2
// or 5 times a power of ten, the range widened to them. A log axis keeps the ticks in its range and
// adds each power of ten below them, so a loss falling from 5.5 to 0.05 is labelled in each decade.
static Axis make_axis(const Run *runs, int num_runs, int of_loss, int log) {
    double min = INFINITY, max = -INFINITY;
    for (int r = 0; r < num_runs; r++)
        for (int i = 0; i < runs[r].n; i++) {
            min = fmin(min, of_loss ? runs[r].loss[i] : runs[r].x[i]);
            max = fmax(max, of_loss ? runs[r].loss[i] : runs[r].x[i]);
        }
    // one point or a flat curve still gets a range to draw
    double pad = max - min > 1e-12 * fabs(max) ? 0 : min != 0 ? 0.1 * fabs(min) : 1;
    double raw = (max - min + 2 * pad) / 4, power = pow(10, floor(log10(raw))), f = raw / power;
    double step = (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * power;
    double first = floor((min - pad) / step + 1e-9), last = ceil((max + pad) / step - 1e-9);
    Axis a = {.lo = first * step, .hi = last * step, .log = log};
    for (double k = first; k <= last && a.num_ticks < 64; k++) a.ticks[a.num_ticks++] = k * step;
    if (!log) return a;
    double log_pad = fmax(0.05 * (log10(max) - log10(min)), 0.01);
    a.lo = log10(min) - log_pad;
    a.hi = log10(max) + log_pad;
    int n = 0;
    for (int i = 0; i < a.num_ticks; i++)
        if (a.ticks[i] > 0 && log10(a.ticks[i]) >= a.lo && log10(a.ticks[i]) <= a.hi)
            a.ticks[n++] = a.ticks[i]; // ascending: ticks[0] stays the smallest
    for (double e = floor(a.hi); e >= a.lo && n < 64; e--)
        if (pow(10, e) < a.ticks[0] / 2) a.ticks[n++] = pow(10, e);
    a.num_ticks = n;
    return a;
}

// where value v falls along an axis of the given length, 0 at lo
static double along(const Axis *a, double v, double length) {
    return ((a->log ? log10(v) : v) - a->lo) / (a->hi - a->lo) * length;
}

// 0.5, 20, 1.5K, 3M: short enough to sit under a tick
static const char *tick_label(char *buf, size_t size, double v) {
    const char *suffix[] = {"", "K", "M", "B", "T"};
    int i = 0;
    for (; fabs(v) >= 1000 && i < 4; i++) v /= 1000;
    snprintf(buf, size, "%.4g%s", v, suffix[i]);
    return buf;
}

// draws the runs over the axes; their points become picture coordinates
static void draw(const char *out, const char *title, const char *x_key, Run *runs, int num_runs,
                 const Axis *ax, const Axis *ay) {
    double w = WIDTH - LEFT - RIGHT, h = HEIGHT - TOP - BOTTOM, bottom = TOP + h;
    char label[32], tip[512];
    Svg svg;
    svg_open(&svg, out, WIDTH, HEIGHT);
    svg_text(&svg, WIDTH / 2, 28, 18, "middle", "black", "%s", title);
    for (int i = 0; i < ax->num_ticks; i++) {
        double x = LEFT + along(ax, ax->ticks[i], w);
        svg_line(&svg, x, TOP, x, bottom, "#e5e5e5", 1);
        svg_text(&svg, x, bottom + 18, 12, "middle", "#333333", "%s",
                 tick_label(label, sizeof label, ax->ticks[i]));
    }
    for (int i = 0; i < ay->num_ticks; i++) {
        double y = bottom - along(ay, ay->ticks[i], h);
        svg_line(&svg, LEFT, y, LEFT + w, y, "#e5e5e5", 1);
        svg_text(&svg, LEFT - 8, y + 4, 12, "end", "#333333", "%s",
                 tick_label(label, sizeof label, ay->ticks[i]));
    }
    svg_line(&svg, LEFT, bottom, LEFT + w, bottom, "black", 1);
    svg_line(&svg, LEFT, TOP, LEFT, bottom, "black", 1);
    svg_text(&svg, LEFT + w / 2, HEIGHT - 12, 14, "middle", "black", "%s", x_key);
    svg_text(&svg, LEFT, TOP - 10, 14, "middle", "black", "loss%s", ay->log ? " (log scale)" : "");

    for (int r = 0; r < num_runs; r++) {
        Run *run = &runs[r];
        const char *color = COLORS[r % (sizeof COLORS / sizeof *COLORS)];
        double width = fmax(3.0 / (1 + r), 0.75); // later runs thinner, over the earlier ones
        snprintf(tip, sizeof tip, "%s: %d points, loss %.4g to %.4g", run->name, run->n,
                 run->loss[0], run->loss[run->n - 1]);
        for (int i = 0; i < run->n; i++) { // the points become picture coordinates
            run->x[i] = LEFT + along(ax, run->x[i], w);
            run->loss[i] = bottom - along(ay, run->loss[i], h); // SVG's y grows downward
        }
        svg_path_named(&svg, run->x, run->loss, run->n, color, width, "run", tip, run->name);
        // the legend, top right, where a falling loss leaves room
        double legend_y = TOP + 20 + 18 * r;
        svg_text(&svg, LEFT + w - 45, legend_y + 4, 12, "end", "black", "%s", run->name);
        svg_line(&svg, LEFT + w - 40, legend_y, LEFT + w - 12, legend_y, color, width);
    }
    svg_close(&svg);
}

int main(int argc, char **argv) {
    const char *out = NULL, *x_key = "step", *title = "training loss";
    int log_y = 0, num_runs = 0;
    Run *runs = xmalloc(argc * sizeof(Run));
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], **value = strcmp(arg, "--out") == 0     ? &out
                                             : strcmp(arg, "--x") == 0     ? &x_key
                                             : strcmp(arg, "--title") == 0 ? &title
                                                                           : NULL;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            printf("%s\n", USAGE);
            return 0;
        } else if (strcmp(arg, "--log_y") == 0) {
            log_y = 1;
        } else if (value) {
            if (i + 1 >= argc) user_error("plot_loss: %s needs a value (see --help)", arg);
            *value = argv[++i];
        } else if (strncmp(arg, "--", 2) == 0) {
            user_error("plot_loss: unknown flag '%s' (see ./plot_loss --help)", arg);
        } else {
            parse_run(&runs[num_runs++], arg);
        }
    }
    if (!out) user_error("plot_loss: --out FILE.svg is needed: where to write the picture");
    if (strcmp(x_key, "step") != 0 && strcmp(x_key, "tokens") != 0)
        user_error("plot_loss: --x %s: want step or tokens", x_key);
    if (num_runs == 0)
        user_error("plot_loss: no metrics file given: name one or more after the flags, e.g. "
                   "./plot_loss --out loss.svg tmp/exp/metrics.jsonl");

    int points = 0;
    for (int r = 0; r < num_runs; r++) {
        load_run(&runs[r], x_key, log_y);
        points += runs[r].n;
    }
    name_runs(runs, num_runs);
    Axis ax = make_axis(runs, num_runs, 0, 0), ay = make_axis(runs, num_runs, 1, log_y);
    draw(out, title, x_key, runs, num_runs, &ax, &ay);
    printf("wrote %s: %d run%s, %d point%s\n", out, num_runs, num_runs == 1 ? "" : "s", points,
           points == 1 ? "" : "s");
    return 0; // the runs' memory goes with the process
}
