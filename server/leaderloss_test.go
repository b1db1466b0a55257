package server

import "testing"

func TestCampaignRank(t *testing.T) {
	voters := map[uint64]struct{}{30: {}, 10: {}, 20: {}, 40: {}}
	for _, c := range []struct {
		self, lost uint64
		rank       int
		voter      bool
	}{
		{10, 40, 0, true}, {20, 40, 1, true}, {30, 40, 2, true}, // the lost leader takes no turn
		{20, 10, 0, true}, {40, 10, 2, true},
		{50, 10, -1, false}, // a learner
	} {
		rank, voter := campaignRank(voters, c.self, c.lost)
		if rank != c.rank || voter != c.voter {
			t.Errorf("campaignRank(self %d, lost %d) = %d, %v; want %d, %v", c.self, c.lost, rank, voter, c.rank, c.voter)
		}
	}
}
