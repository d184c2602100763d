// Package crowdsec connects sluice to a CrowdSec Local API both ways.
//
// As a bouncer (remediation component), a Bouncer follows the Local API's
// decision stream with a bouncer's API key (cscli bouncers add) and keeps
// one dynamic rule per source and decision type in every region's Redis
// (rules/store), where the enforcers load it within a second: a ban on an
// address, a range or an AS denies it for the decision's duration, other
// types (captcha, throttle, custom ones) limit it (Mapping), and a deleted
// decision deletes its rule. Decisions on scopes requests carry no
// descriptor for (Country, Username, ...) are counted and logged. Shadow
// mode, a cap of its own, the region's cap and kill switch, promotion and
// rollback apply as to every dynamic rule.
//
// The other way, an AlertPusher pushes the dynamic rules the detector
// emits to the Local API as alerts (scenario sluice/<signal>, the rule's
// source, evidence and count), logged in as a machine (cscli machines
// add), so that cscli alerts list and CrowdSec's console show them.
//
// Client speaks the Local API's v1 REST interface with net/http; Mapping
// and the bouncer's decision state are I/O-free. docs/crowdsec.md is the
// operator's guide (`sluice crowdsec`, `--crowdsec-alerts`).
//
// # Usage
//
//	cl, err := crowdsec.NewClient(crowdsec.ClientOptions{URL: "http://127.0.0.1:8080", APIKey: key})
//	if err != nil { ... }
//	b, err := crowdsec.NewBouncer(crowdsec.Options{
//		Source:  cl,
//		Regions: []crowdsec.Region{{Name: "eu-west", Store: store.NewStore(rdb)}},
//		Mapping: crowdsec.Mapping{Limits: map[string]crowdsec.Limit{"captcha": {Limit: 10, Period: time.Minute}}},
//		Logger:  log, Registerer: reg,
//	})
//	if err != nil { ... }
//	go b.Run(ctx) // until ctx ends
//
// # Metrics
//
// A Bouncer's, on Options.Registerer:
//
//	sluice_crowdsec_decisions_received_total{kind}          decisions read: new (or active, at startup), deleted
//	sluice_crowdsec_decisions_refused_total{reason}         decisions that make no rule: scope, value, duration
//	sluice_crowdsec_decisions                               active decisions that make rules
//	sluice_crowdsec_invalid_rules_total                     rules that did not validate (none expected)
//	sluice_crowdsec_stream_errors_total                     failed pulls of the stream
//	sluice_crowdsec_stream_age_seconds                      since the last successful pull (or the start)
//	sluice_crowdsec_rules_applied_total{region}             rules written new (again after Redis lost them)
//	sluice_crowdsec_rules_updated_total{region}             rules rewritten (changed, renewed)
//	sluice_crowdsec_rules_deleted_total{region}             rules deleted with their decisions
//	sluice_crowdsec_rules_refused_total{region,reason}      rules waiting: cap, region_cap, killed
//	sluice_crowdsec_rules{region}                           the bouncer's rules in the region's Redis
//	sluice_crowdsec_region_errors_total{region}             failed syncs of the region's Redis
//	sluice_crowdsec_apply_lag_seconds{region}               from the stream's answer to the rule in Redis
//
// An AlertPusher's:
//
//	sluice_crowdsec_alerts_total{result}                    sent, dropped (queue full), refused (400)
//	sluice_crowdsec_alert_push_errors_total                 failed pushes, retried
package crowdsec
