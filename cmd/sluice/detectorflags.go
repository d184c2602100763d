//go:build !sidecar

package main

import (
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"

	"github.com/sluice-rl/sluice/detector"
	"github.com/sluice-rl/sluice/detector/enrich"
	"github.com/sluice-rl/sluice/replay"
)

// detectorFlags are the detector's options that sluice pipeline and sluice
// replay share: the crawler operators' ranges and the content signal's
// lists, both folders the operator refreshes.
type detectorFlags struct {
	rangesDir, listsDir, holdings string
}

func (d *detectorFlags) add(f *pflag.FlagSet) {
	f.StringVar(&d.rangesDir, "crawler-ranges", "", "directory of crawler operators' published ranges, <operator>-*.txt with one CIDR a line (docs/detector.md); claims from inside are verified (and exempt from the volume and shape signals), from outside judged")
	f.StringVar(&d.holdings, "asn-holdings", "", "an iptoasn TSV (ip2asn-v4.tsv, optionally .gz) whose ranges tell each crawler operator's address space: a claim of its crawler from outside it is false (docs/detector.md); sluice replay defaults to its --data's")
	f.StringVar(&d.listsDir, "content-lists", "", "directory of content-signal list files replacing the built-in ones of their categories (sensitive.txt, admin.txt, ...; docs/detector.md)")
}

// options loads the folders named into o, logging what it loaded.
func (d *detectorFlags) options(o detector.Options, log *slog.Logger) (detector.Options, error) {
	if d.rangesDir != "" {
		r, err := enrich.LoadCrawlerRanges(d.rangesDir)
		if err != nil {
			return o, err
		}
		o.FakeCrawlers.Ranges = r
		log.Info("crawler ranges loaded", "dir", d.rangesDir, "operators", r.Operators())
	}
	if d.holdings != "" {
		db, err := enrich.OpenASN(d.holdings)
		if err != nil {
			return o, err
		}
		o.FakeCrawlers.Holdings = db
		log.Info("ASN holdings loaded", "file", d.holdings)
	}
	if d.listsDir != "" {
		lists, err := detector.LoadContentLists(d.listsDir)
		if err != nil {
			return o, err
		}
		o.Content.Patterns = lists
		log.Info("content lists loaded", "dir", d.listsDir)
	}
	return o, nil
}

// replayRedisFlags are the Redis flags that sluice replay and sluice eval
// share: a redis-server whose databases each replay flushes, one per
// region, named by --redis on the command line (REDIS_ADDR alone is
// refused), or (empty) an in-process Redis; with the credentials and TLS
// flags of every command (redisconn.go).
type replayRedisFlags struct {
	redisFlags
	db int
}

func (r *replayRedisFlags) add(f *pflag.FlagSet) {
	r.redisFlags.add(f, "redis-server address (default: in-process, whose Lua is some 40% slower); each replay FLUSHES one database per region from --redis-db on", singleNode)
	f.IntVar(&r.db, "redis-db", 0, "first Redis database to use with --redis (or the --redis URL's /DB)")
}

// options sets o's Redis address (the flag; REDIS_ADDR alone is refused), database,
// credentials and TLS, and checks them before any replay starts.
func (r *replayRedisFlags) options(fs *pflag.FlagSet, o replay.Options) (replay.Options, error) {
	t, err := r.resolve(fs)
	if err != nil {
		return o, err
	}
	if err := t.single(); err != nil {
		return o, err
	}
	o.RedisDB = r.db
	if t.DB != 0 {
		if fs.Changed("redis-db") && r.db != t.DB {
			return o, fmt.Errorf("--redis-db %d and database %d in %s: give the database once", r.db, t.DB, t.From)
		}
		o.RedisDB = t.DB
	}
	if fl := fs.Lookup("redis"); len(t.Addrs) > 0 && fl != nil && !fl.Changed {
		// Found by a fresh user: REDIS_ADDR, exported for sluice serve as
		// the README's production section shows, made the quick start's
		// replay flush that Redis (its counters, its rules) unasked.
		return o, fmt.Errorf("REDIS_ADDR names a Redis (%s), and a replay FLUSHES one database per region of the Redis it uses, from database %d on: give it as --redis to confirm, or unset REDIS_ADDR to replay on the in-process Redis",
			t.Addrs[0], o.RedisDB)
	}
	switch {
	case len(t.Addrs) > 0:
		o.RedisAddr = t.Addrs[0]
		o.RedisAuth = func(ro *redis.Options) { t.Auth.options(ro) }
	case o.RedisDB != 0:
		return o, fmt.Errorf("--redis-db %d without --redis (or REDIS_ADDR): the in-process Redis has no databases to choose", o.RedisDB)
	}
	if o.RedisDB < 0 {
		return o, fmt.Errorf("--redis-db %d: a Redis database number is >= 0", o.RedisDB)
	}
	return o, nil
}
