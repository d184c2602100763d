package pipeline

import "math"

const minInt64 = math.MinInt64
