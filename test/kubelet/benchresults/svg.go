package benchresults

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
)

// Chart is one chart of a key against the sections' pod counts: a line
// per column through the medians, a whisker from min to max at each point.
type Chart struct {
	// Name is the file's base name (Name + ".svg").
	Name, Title, XLabel, YLabel string
	// Key is the figure drawn; rows of sections without a pod count are
	// left out.
	Key string
}

// Charts are the charts benchrender draws.
var Charts = []Chart{
	{Name: "burst-p99", Title: "Burst: per pod, create sent → published, p99", XLabel: "pods bound at once", YLabel: "seconds", Key: "burst_p99_s"},
	{Name: "serial-added-p50", Title: "Pods one after another: added latency p50", XLabel: "pods", YLabel: "ms", Key: "added_p50_ms"},
	{Name: "steady-cpu", Title: "Steady state: agent CPU per minute", XLabel: "volumes published", YLabel: "CPU ms per minute", Key: "steady_cpu_ms_per_min"},
	{Name: "steady-api", Title: "Steady state: API requests per minute (watches re-opened included)", XLabel: "volumes published", YLabel: "requests per minute", Key: "steady_api_per_min"},
}

// point is one column's runs at one pod count.
type point struct{ x, med, lo, hi float64 }

// series is the points of every column of c, in column order.
func (f *File) series(c Chart) ([]Column, [][]point) {
	var cols []Column
	var out [][]point
	rows := f.Rows()
	for _, col := range f.Columns {
		var pts []point
		for _, r := range rows {
			cell, ok := r.Cells[col.ID]
			if r.Key != c.Key || r.Pods <= 0 || !ok || cell.N == 0 {
				continue
			}
			pts = append(pts, point{float64(r.Pods), cell.Median, cell.Min, cell.Max})
		}
		if len(pts) == 0 {
			continue
		}
		slices.SortFunc(pts, func(a, b point) int { return int(math.Copysign(1, a.x-b.x)) })
		cols = append(cols, col)
		out = append(out, pts)
	}
	return cols, out
}

// palette colors the columns in order.
var palette = []string{"#c0392b", "#1f5fbf", "#27ae60", "#8e44ad", "#d68910", "#555555"}

// SVG draws c, or returns false when no row has its key. Both axes are
// logarithmic (non-positive values are left out); the drawing is a pure
// function of the file.
func (f *File) SVG(c Chart) (string, bool) {
	cols, series := f.series(c)
	const (
		w, h                   = 720.0, 440.0
		left, right, top, bott = 80.0, 220.0, 40.0, 60.0
	)
	minX, maxX, minY, maxY := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, pts := range series {
		for _, p := range pts {
			minX, maxX = math.Min(minX, p.x), math.Max(maxX, p.x)
			for _, y := range []float64{p.med, p.lo, p.hi} {
				if y > 0 {
					minY, maxY = math.Min(minY, y), math.Max(maxY, y)
				}
			}
		}
	}
	if math.IsInf(minY, 1) {
		return "", false
	}
	// Whole decades around the points.
	x0, x1 := math.Floor(math.Log10(minX)), math.Ceil(math.Log10(maxX))
	y0, y1 := math.Floor(math.Log10(minY)), math.Ceil(math.Log10(maxY))
	if x1 == x0 {
		x1++
	}
	if y1 == y0 {
		y1++
	}
	pw, ph := w-left-right, h-top-bott
	px := func(x float64) float64 { return left + (math.Log10(x)-x0)/(x1-x0)*pw }
	py := func(y float64) float64 { return top + ph - (math.Log10(y)-y0)/(y1-y0)*ph }
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&sb, `<rect width="%.0f" height="%.0f" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&sb, `<text x="%.0f" y="22" font-size="14" text-anchor="middle">%s</text>`+"\n", left+pw/2, html.EscapeString(c.Title))
	fmt.Fprintf(&sb, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#888"/>`+"\n", left, top, pw, ph)
	for d := x0; d <= x1; d++ {
		x := left + (d-x0)/(x1-x0)*pw
		fmt.Fprintf(&sb, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ddd"/><text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n",
			x, top, x, top+ph, x, top+ph+16, Format(math.Pow(10, d)))
	}
	for d := y0; d <= y1; d++ {
		y := top + ph - (d-y0)/(y1-y0)*ph
		fmt.Fprintf(&sb, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/><text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n",
			left, y, left+pw, y, left-6, y+4, Format(math.Pow(10, d)))
	}
	fmt.Fprintf(&sb, `<text x="%.0f" y="%.0f" text-anchor="middle">%s (log)</text>`+"\n", left+pw/2, h-18, html.EscapeString(c.XLabel))
	fmt.Fprintf(&sb, `<text x="18" y="%.0f" text-anchor="middle" transform="rotate(-90 18 %.0f)">%s (log)</text>`+"\n", top+ph/2, top+ph/2, html.EscapeString(c.YLabel))
	for i, pts := range series {
		color := palette[i%len(palette)]
		var path []string
		for _, p := range pts {
			if p.med <= 0 {
				continue
			}
			path = append(path, fmt.Sprintf("%.1f,%.1f", px(p.x), py(p.med)))
			if p.lo > 0 && p.hi > p.lo {
				fmt.Fprintf(&sb, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", px(p.x), py(p.lo), px(p.x), py(p.hi), color)
			}
			fmt.Fprintf(&sb, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s: %s at %s</title></circle>`+"\n",
				px(p.x), py(p.med), color, html.EscapeString(cols[i].ID), Format(p.med), Format(p.x))
		}
		if len(path) > 1 {
			fmt.Fprintf(&sb, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"/>`+"\n", strings.Join(path, " "), color)
		}
		ly := top + 10 + float64(i)*20
		fmt.Fprintf(&sb, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="2"/><text x="%.0f" y="%.0f">%s</text>`+"\n",
			w-right+12, ly, w-right+32, ly, color, w-right+38, ly+4, html.EscapeString(cols[i].ID))
	}
	fmt.Fprintf(&sb, `<text x="%.0f" y="%.0f" fill="#666">median of the runs; bars: min–max</text>`+"\n", w-right+12, top+10+float64(len(series))*20+10)
	fmt.Fprintf(&sb, `<text x="%.0f" y="%.0f" fill="#666">commit %s</text>`+"\n", w-right+12, top+10+float64(len(series))*20+28, html.EscapeString(short(f.Commit)))
	sb.WriteString("</svg>\n")
	return sb.String(), true
}
