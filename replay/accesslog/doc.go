// Package accesslog reads request logs for replays: the Apache/nginx
// combined and common formats, and the tab-separated NASA-HTTP conversion.
//
// Each line becomes an Entry (client, time in UTC, request line, status,
// bytes, referer, user agent) numbered as in its file. A malformed line is a
// *ParseError that names the line and the cause and does not stop the
// Reader, so a replay can account for every line: Stats().Lines ==
// Entries + Malformed + Header + Blank. The parser is hand-written (no
// regular expressions) and allocates one string per line.
//
// ParseCombined documents which damaged lines are still entries (a line cut
// inside the user agent) and which are errors (no valid client or
// timestamp, or cut before the status); Entry documents request fields that
// are not "METHOD PATH PROTO".
//
// # Usage
//
//	f, err := os.Open("access.log")
//	if err != nil {
//		return err
//	}
//	defer f.Close()
//	r := accesslog.NewReader(f, accesslog.FormatAuto)
//	for {
//		e, err := r.Next()
//		if err == io.EOF {
//			break
//		}
//		var pe *accesslog.ParseError
//		if errors.As(err, &pe) {
//			logger.Warn("skipping log line", "line", pe.Line, "err", pe.Err)
//			continue
//		}
//		if err != nil {
//			return err
//		}
//		replay(e.Time, e.Client, e.Method, e.Path, e.UserAgent)
//	}
//	logger.Info("log read", "entries", r.Stats().Entries, "malformed", r.Stats().Malformed)
package accesslog
