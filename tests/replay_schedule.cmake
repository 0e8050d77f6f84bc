# Golden checks of the delay distributions and the schedule simulator (replay/schedule.h).
onlineps_test(schedule_test onlineps_replay_schedule)
