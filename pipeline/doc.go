// Package pipeline is sluice's slow loop: the decision-record codec
// (decisionpb), the Kafka producer enforcers log decisions with, and the
// two-tier consumer that runs stages (the detector, the aggregator, the
// shadow tally) over the decision topic on event time and publishes their
// output to the output topic (TopicWriter), from which an Applier per
// region writes it into that region's Redis (or writes it to every region's
// Redis itself: RegionWriter). Beside it, the regions exchange their
// G-Counter quota counts on the quota topic: a QuotaPublisher per enforcer
// publishes its region's counts, and a QuotaApplier per region merges the
// others' into its Redis by element-wise maximum.
//
// The partition tier (Consumer, a consumer group) keeps each partition's
// window state per stage and sends it, when the partition's watermark closes
// a window, to the merge tier (Merger), which merges every partition's state
// in partition order and calls the stage's Finish. The output is the same
// whatever the number of consumers, and across rebalances and restarts: see
// docs/pipeline.md. Local runs the same cores without Kafka.
//
// # Usage
//
//	prod, err := pipeline.NewProducer(pipeline.ProducerOptions{Brokers: brokers})
//	lim, err := enforcer.New(rdb, set, enforcer.Options{Sink: prod})
//
//	o := pipeline.Options{
//		Brokers: brokers,
//		Stages:  []stage.Stage{detector.NewHeavyHitters(detector.HeavyHitterOptions{}), shares},
//		Writer:  tw, // pipeline.NewTopicWriter(pipeline.TopicWriterOptions{Brokers: brokers})
//		Registerer: reg,
//	}
//	if err := pipeline.EnsureTopics(ctx, o, 0); err != nil { ... }
//	pl, err := pipeline.New(o) // both tiers; or NewConsumer / NewMerger alone
//	pl.Start(ctx)
//	defer pl.Close()
//
//	// In each region:
//	ap, err := pipeline.NewApplier(pipeline.ApplierOptions{Brokers: brokers, Region: "eu-west", Store: store.NewStore(rdb), Registerer: reg})
//	go ap.Run(ctx)
//	defer ap.Close()
//
// Metrics (docs/pipeline.md has the whole list):
//
//	sluice_pipeline_producer_records_total{result}   logged, dropped, produced, failed
//	sluice_pipeline_records_in_total{stage}          fetch, decode, each stage, merge
//	sluice_pipeline_decode_errors_total              to the dead-letter topic
//	sluice_pipeline_late_records_total{reason}       past, future
//	sluice_pipeline_consumer_lag_records{tier}       partition, merge
//	sluice_pipeline_batch_duration_seconds{tier}     histogram
//	sluice_apply_records_total{region,kind,result}   rule: applied, expired, killed, refused; share: applied, other_region
//	sluice_apply_bad_records_total{region}           undecodable output records, skipped
//	sluice_apply_lag_records{region}                 output records not yet applied
//	sluice_apply_delay_seconds{region}               publication to application (histogram)
//	sluice_quota_counts_published_total              G-Counter counts published (QuotaPublisher)
//	sluice_quota_publish_errors_total                failed publications, kept for the next
//	sluice_quota_records_total{region}               quota records read (QuotaApplier)
//	sluice_quota_fields_raised_total{region}         per-region counts raised by a merge
//	sluice_quota_bad_records_total{region}           undecodable quota records, skipped
//	sluice_quota_write_errors_total{region}          failed merges into Redis (retried)
package pipeline
