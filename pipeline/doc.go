// Package pipeline is the Kafka shell of sluice's slow loop (franz-go): the
// producer enforcers log decision records with (Producer, a decision.Sink),
// and the two-tier consumer that runs stages (the detector, the aggregator,
// the shadow tally) over the decision topic on event time and publishes
// their output to the output topic (TopicWriter), from which an Applier per
// region writes it into that region's Redis (or writes it to every region's
// Redis itself: RegionWriter). The decision record and its codec are package
// decision's; the stage contract and the I/O-free core that both tiers drive
// (partition and merge state, watermarks, partial records, Local) are
// package pipeline/stage's; the G-Counter exchange between regions is
// package pipeline/gcounter's, over the helpers exported here (Poll,
// FatalFetchError, RewindIfLost, ApplyGroupOpts).
//
// The partition tier (Consumer, a consumer group) keeps each partition's
// window state per stage and sends it, when the partition's watermark closes
// a window, to the merge tier (Merger), which merges every partition's state
// in partition order and calls the stage's Finish. The output is the same
// whatever the number of consumers, and across rebalances and restarts: see
// docs/pipeline.md. stage.Local runs the same cores without Kafka.
//
// A tier's Run returns nil when its context ends or it is closed, and the
// error when Kafka refuses it for good (an authorization failure, an invalid
// group: FatalFetchError); every other fetch error is logged and retried.
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
package pipeline
