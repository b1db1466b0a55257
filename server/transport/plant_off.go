//go:build !plantoldpeer

package transport

// plantedNoFallback is false in every real build (plant_on.go).
const plantedNoFallback = false
