// Package gcounter is the regions' exchange of G-Counter quota counts over
// Kafka: for a fixed-window rule with g_counter (rules.Rule.GCounter), each
// region counts its own admissions in its Redis, and the global count of a
// window is the sum over the regions of each region's largest count, a
// G-Counter (Shapiro et al. 2011, "A comprehensive study of Convergent and
// Commutative Replicated Data Types", INRIA RR-7506).
//
// A QuotaPublisher beside each enforcer publishes its region's counts
// (decision.QuotaCount, read from the limiter, a QuotaSource) to the quota
// topic every interval (1 s); a QuotaApplier per region merges every other
// region's counts into its Redis by element-wise maximum, so that a count
// applied twice, late or out of order changes nothing. Records are versioned
// (QuotaFormat) and checked: a window longer than a year and a day, or a
// count above 2^53, is refused and counted.
//
// The exchange is part of the Kafka shell: it links franz-go and go-redis,
// and imports no enforcer: the enforcer's merge (enforcer.MergeQuotaCounts)
// comes in QuotaApplierOptions.Merge.
//
// Metrics:
//
//	sluice_quota_counts_published_total              G-Counter counts published (QuotaPublisher)
//	sluice_quota_publish_errors_total                failed publications, kept for the next
//	sluice_quota_records_total{region}               quota records read (QuotaApplier)
//	sluice_quota_fields_raised_total{region}         per-region counts raised by a merge
//	sluice_quota_bad_records_total{region}           undecodable quota records, skipped
//	sluice_quota_write_errors_total{region}          failed merges into Redis (retried)
package gcounter
